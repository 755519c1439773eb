//! The DNS wire format (RFC 1035 4), the part Palisade reads: the header,
//! the one question, and the answer section's records. The authority and
//! additional sections are never read: nothing is learned from them
//! (additional records are the classic poisoning vector).
//!
//! Every read is bounds-checked and every error names the byte it failed
//! at. Compression pointers must point strictly backwards, so that reading
//! any name terminates (a loop needs a pointer forwards or to itself) and
//! costs at most one pass over the message.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::name::{Name, NameError, MAX_NAME_WIRE_LEN};

/// The most compression pointers one name may follow: as many as it could
/// have labels (each takes two bytes or more of the 255).
pub const MAX_POINTER_HOPS: usize = MAX_NAME_WIRE_LEN / 2;

/// Header length (RFC 1035 4.1.1).
pub const HEADER_LEN: usize = 12;
/// Record types and the class Palisade reads (RFC 1035 3.2.2, RFC 3596).
pub const TYPE_A: u16 = 1;
pub const TYPE_CNAME: u16 = 5;
pub const TYPE_AAAA: u16 = 28;
pub const CLASS_IN: u16 = 1;
/// The query opcode, and the response code for no error.
pub const OPCODE_QUERY: u8 = 0;
pub const RCODE_NOERROR: u8 = 0;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub id: u16,
    /// QR: a response, not a query.
    pub response: bool,
    pub opcode: u8,
    /// TC: the answer did not fit and was cut.
    pub truncated: bool,
    pub rcode: u8,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Question {
    pub name: Name,
    pub qtype: u16,
    pub qclass: u16,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RData {
    A(Ipv4Addr),
    Aaaa(Ipv6Addr),
    Cname(Name),
    /// Any other type: kept only as its type, never read.
    Other,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub name: Name,
    pub rtype: u16,
    pub class: u16,
    pub ttl: u32,
    pub data: RData,
}

/// A query or a response, with exactly one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub header: Header,
    pub question: Question,
    /// The answer section (empty in a query).
    pub answers: Vec<Record>,
}

/// Why bytes are not a message Palisade reads.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("the message is {len} bytes and ends inside the {what} at byte {at}")]
    Truncated {
        what: &'static str,
        at: usize,
        len: usize,
    },
    #[error("the name at byte {at} has a compression pointer to byte {target}, not before it")]
    PointerNotBackwards { at: usize, target: usize },
    #[error("the name at byte {at} follows more than {MAX_POINTER_HOPS} compression pointers")]
    PointerChain { at: usize },
    #[error(
        "the name at byte {at} has label type bits {bits:#04x}, neither a label nor a pointer"
    )]
    LabelType { at: usize, bits: u8 },
    #[error("the name at byte {at}: {source}")]
    Name { at: usize, source: NameError },
    #[error("{count} questions; Palisade reads messages with exactly one")]
    QuestionCount { count: u16 },
    #[error("the record at byte {at}: type {rtype} data is {len} bytes, expected {expected}")]
    RDataLength {
        at: usize,
        rtype: u16,
        len: usize,
        expected: usize,
    },
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.buf.len())
            .ok_or(WireError::Truncated {
                what,
                at: self.at,
                len: self.buf.len(),
            })?;
        let bytes = &self.buf[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, WireError> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, WireError> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// Reads a possibly compressed name starting here; leaves the reader
    /// after the name's bytes at this position (after the first pointer).
    fn name(&mut self) -> Result<Name, WireError> {
        let start = self.at;
        let mut name = Name::root();
        let mut pos = self.at;
        let mut resume: Option<usize> = None;
        let mut index = 0;
        let mut hops = 0;
        loop {
            let len_byte = *self.buf.get(pos).ok_or(WireError::Truncated {
                what: "name",
                at: pos,
                len: self.buf.len(),
            })?;
            match len_byte & 0xC0 {
                0x00 if len_byte == 0 => {
                    self.at = resume.unwrap_or(pos + 1);
                    return Ok(name);
                }
                0x00 => {
                    let label_at = pos + 1;
                    let label = self.buf.get(label_at..label_at + len_byte as usize).ok_or(
                        WireError::Truncated {
                            what: "label",
                            at: pos,
                            len: self.buf.len(),
                        },
                    )?;
                    name.push(label, index)
                        .map_err(|source| WireError::Name { at: start, source })?;
                    index += 1;
                    pos = label_at + len_byte as usize;
                }
                0xC0 => {
                    let low = *self.buf.get(pos + 1).ok_or(WireError::Truncated {
                        what: "compression pointer",
                        at: pos,
                        len: self.buf.len(),
                    })?;
                    let target = (usize::from(len_byte & 0x3F) << 8) | usize::from(low);
                    if target >= pos {
                        return Err(WireError::PointerNotBackwards { at: pos, target });
                    }
                    // Backwards pointers end, but a chain of them could still
                    // be walked once per record: bound it as labels are.
                    hops += 1;
                    if hops > MAX_POINTER_HOPS {
                        return Err(WireError::PointerChain { at: start });
                    }
                    resume.get_or_insert(pos + 2);
                    pos = target;
                }
                bits => return Err(WireError::LabelType { at: pos, bits }),
            }
        }
    }
}

impl Message {
    /// Reads a message: its header, its one question and, in a response,
    /// its answer section. Trailing sections are not read.
    pub fn parse(buf: &[u8]) -> Result<Message, WireError> {
        let mut r = Reader { buf, at: 0 };
        let id = r.u16("header")?;
        let flags = r.u16("header")?;
        let qdcount = r.u16("header")?;
        let ancount = r.u16("header")?;
        r.take(4, "header")?; // NSCOUNT, ARCOUNT: never read.
        let header = Header {
            id,
            response: flags & 0x8000 != 0,
            opcode: ((flags >> 11) & 0xF) as u8,
            truncated: flags & 0x0200 != 0,
            rcode: (flags & 0xF) as u8,
        };
        if qdcount != 1 {
            return Err(WireError::QuestionCount { count: qdcount });
        }
        let question = Question {
            name: r.name()?,
            qtype: r.u16("question")?,
            qclass: r.u16("question")?,
        };
        let mut answers = Vec::new();
        if header.response {
            // Each record is at least 11 bytes: a hostile count costs no
            // more than the bytes that carry it.
            for _ in 0..ancount {
                answers.push(record(&mut r)?);
            }
        }
        Ok(Message {
            header,
            question,
            answers,
        })
    }

    /// Writes the message: header, question, answers (no other sections).
    /// A name equal to the question's is written as a pointer to it, as
    /// servers do; any other name in full.
    pub fn encode(&self) -> Vec<u8> {
        let h = &self.header;
        let mut out = Vec::with_capacity(64 + 16 * self.answers.len());
        out.extend(h.id.to_be_bytes());
        let flags = (u16::from(h.response) << 15)
            | (u16::from(h.opcode & 0xF) << 11)
            | (u16::from(h.truncated) << 9)
            | u16::from(h.rcode & 0xF);
        out.extend(flags.to_be_bytes());
        out.extend(1u16.to_be_bytes());
        out.extend((self.answers.len() as u16).to_be_bytes());
        out.extend([0, 0, 0, 0]);
        let qname_at = out.len() as u16;
        let qname = &self.question.name;
        let write_name = |out: &mut Vec<u8>, name: &Name| {
            if name == qname && !name.wire().is_empty() {
                out.extend((0xC000 | qname_at).to_be_bytes());
            } else {
                out.extend(name.wire());
                out.push(0);
            }
        };
        out.extend(qname.wire());
        out.push(0);
        out.extend(self.question.qtype.to_be_bytes());
        out.extend(self.question.qclass.to_be_bytes());
        for rec in &self.answers {
            write_name(&mut out, &rec.name);
            out.extend(rec.rtype.to_be_bytes());
            out.extend(rec.class.to_be_bytes());
            out.extend(rec.ttl.to_be_bytes());
            let data: Vec<u8> = match &rec.data {
                RData::A(a) => a.octets().to_vec(),
                RData::Aaaa(a) => a.octets().to_vec(),
                RData::Cname(n) => {
                    let mut d = Vec::new();
                    write_name(&mut d, n);
                    // A pointer inside RDATA still points into the message.
                    d
                }
                RData::Other => Vec::new(),
            };
            out.extend((data.len() as u16).to_be_bytes());
            out.extend(data);
        }
        out
    }
}

fn record(r: &mut Reader<'_>) -> Result<Record, WireError> {
    let at = r.at;
    let name = r.name()?;
    let rtype = r.u16("record")?;
    let class = r.u16("record")?;
    let ttl = r.u32("record")?;
    let rdlen = usize::from(r.u16("record")?);
    let rdata_at = r.at;
    let rdata = r.take(rdlen, "record data")?;
    let exact = |expected: usize| {
        if rdlen == expected {
            Ok(())
        } else {
            Err(WireError::RDataLength {
                at,
                rtype,
                len: rdlen,
                expected,
            })
        }
    };
    let data = match (class, rtype) {
        (CLASS_IN, TYPE_A) => {
            exact(4)?;
            RData::A(Ipv4Addr::new(rdata[0], rdata[1], rdata[2], rdata[3]))
        }
        (CLASS_IN, TYPE_AAAA) => {
            exact(16)?;
            let mut o = [0u8; 16];
            o.copy_from_slice(rdata);
            RData::Aaaa(Ipv6Addr::from(o))
        }
        (CLASS_IN, TYPE_CNAME) => {
            // The target may be compressed: read it in the whole message,
            // and it must end exactly where the record data does.
            let mut inner = Reader {
                buf: &r.buf[..rdata_at + rdlen],
                at: rdata_at,
            };
            let target = inner.name()?;
            if inner.at != rdata_at + rdlen {
                return Err(WireError::RDataLength {
                    at,
                    rtype,
                    len: rdlen,
                    expected: inner.at - rdata_at,
                });
            }
            RData::Cname(target)
        }
        _ => RData::Other,
    };
    Ok(Record {
        name,
        rtype,
        class,
        ttl,
        data,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub fn name(s: &str) -> Name {
        Name::from_labels(s.split('.').map(str::as_bytes)).unwrap()
    }

    pub fn response(id: u16, q: &str, qtype: u16, answers: Vec<Record>) -> Message {
        Message {
            header: Header {
                id,
                response: true,
                opcode: OPCODE_QUERY,
                truncated: false,
                rcode: RCODE_NOERROR,
            },
            question: Question {
                name: name(q),
                qtype,
                qclass: CLASS_IN,
            },
            answers,
        }
    }

    pub fn rec(owner: &str, ttl: u32, data: RData) -> Record {
        let rtype = match data {
            RData::A(_) => TYPE_A,
            RData::Aaaa(_) => TYPE_AAAA,
            RData::Cname(_) => TYPE_CNAME,
            RData::Other => 16,
        };
        Record {
            name: name(owner),
            rtype,
            class: CLASS_IN,
            ttl,
            data,
        }
    }

    #[test]
    fn round_trip_with_compression() {
        let m = response(
            0xBEEF,
            "api.example.com",
            TYPE_A,
            vec![
                rec("api.example.com", 30, RData::Cname(name("edge.cdn.net"))),
                rec("edge.cdn.net", 60, RData::A(Ipv4Addr::new(192, 0, 2, 7))),
                rec(
                    "api.example.com",
                    5,
                    RData::Aaaa("2001:db8::1".parse().unwrap()),
                ),
            ],
        );
        let bytes = m.encode();
        // The first record's owner is a pointer to the question's name.
        let q_end = HEADER_LEN + name("api.example.com").wire().len() + 1 + 4;
        assert_eq!(&bytes[q_end..q_end + 2], &[0xC0, HEADER_LEN as u8]);
        assert_eq!(Message::parse(&bytes).unwrap(), m);
    }

    #[test]
    fn a_query_reads_no_answers() {
        let mut m = response(7, "a.b", TYPE_AAAA, vec![]);
        m.header.response = false;
        let mut bytes = m.encode();
        // A query that claims an answer: the count is not trusted.
        bytes[7] = 3;
        let parsed = Message::parse(&bytes).unwrap();
        assert!(!parsed.header.response);
        assert!(parsed.answers.is_empty());
    }

    #[test]
    fn every_truncation_is_an_error_never_a_panic() {
        let m = response(
            1,
            "www.example.com",
            TYPE_A,
            vec![
                rec("www.example.com", 30, RData::Cname(name("x.example.com"))),
                rec("x.example.com", 30, RData::A(Ipv4Addr::LOCALHOST)),
            ],
        );
        let bytes = m.encode();
        for len in 0..bytes.len() {
            assert!(Message::parse(&bytes[..len]).is_err(), "cut at {len}");
        }
    }

    #[test]
    fn pointer_loops_and_forward_pointers_are_refused() {
        let mut bytes = response(1, "a.b", TYPE_A, vec![]).encode();
        // The question's name becomes a pointer to itself.
        bytes[HEADER_LEN] = 0xC0;
        bytes[HEADER_LEN + 1] = HEADER_LEN as u8;
        assert_eq!(
            Message::parse(&bytes),
            Err(WireError::PointerNotBackwards {
                at: HEADER_LEN,
                target: HEADER_LEN
            })
        );
        bytes[HEADER_LEN + 1] = 40;
        assert!(matches!(
            Message::parse(&bytes),
            Err(WireError::PointerNotBackwards { .. })
        ));
        bytes[HEADER_LEN] = 0x80;
        assert_eq!(
            Message::parse(&bytes),
            Err(WireError::LabelType {
                at: HEADER_LEN,
                bits: 0x80
            })
        );
    }

    /// A response whose first record (a TXT the reader skips) carries
    /// `nodes` name fragments made by `node(previous node's offset)`, and
    /// whose second record's owner points at the last fragment. Returns
    /// the bytes and the second record's offset.
    fn pointing_at_a_chain(nodes: usize, node: impl Fn(usize) -> Vec<u8>) -> (Vec<u8>, usize) {
        let mut bytes = response(1, "a.b", TYPE_A, vec![]).encode();
        bytes[7] = 2; // ANCOUNT
        bytes.extend([0, 0, 16, 0, 1, 0, 0, 0, 1]); // root owner, TXT, IN, TTL
        let rdlen_at = bytes.len();
        bytes.extend([0, 0]);
        let mut prev = HEADER_LEN;
        for _ in 0..nodes {
            let here = bytes.len();
            bytes.extend(node(prev));
            prev = here;
        }
        let rdlen = (bytes.len() - rdlen_at - 2) as u16;
        bytes[rdlen_at..rdlen_at + 2].copy_from_slice(&rdlen.to_be_bytes());
        let owner = bytes.len();
        bytes.extend([0xC0 | (prev >> 8) as u8, prev as u8]);
        bytes.extend([0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 1, 2, 3, 4]);
        (bytes, owner)
    }

    #[test]
    fn a_name_of_pointers_stays_within_255_bytes() {
        // 200 fragments of label "a" each pointing back to the previous:
        // the name must stop at a limit (here the pointers' one, reached
        // one label before the length's), not grow past it.
        let (bytes, owner) = pointing_at_a_chain(200, |prev| {
            vec![1, b'a', 0xC0 | (prev >> 8) as u8, prev as u8]
        });
        assert_eq!(
            Message::parse(&bytes),
            Err(WireError::PointerChain { at: owner })
        );
        // Labels of 3 bytes reach the length limit first.
        let (bytes, owner) = pointing_at_a_chain(200, |prev| {
            vec![2, b'a', b'a', 0xC0 | (prev >> 8) as u8, prev as u8]
        });
        let err = Message::parse(&bytes).unwrap_err();
        assert!(
            matches!(err, WireError::Name { at, source: NameError::TooLong { .. } } if at == owner),
            "{err}"
        );
        // 100 fragments make a name of 100 labels "a" then "a.b": legal.
        let (bytes, _) = pointing_at_a_chain(100, |prev| {
            vec![1, b'a', 0xC0 | (prev >> 8) as u8, prev as u8]
        });
        let m = Message::parse(&bytes).unwrap();
        assert_eq!(m.answers[1].name.label_count(), 102);
    }

    #[test]
    fn a_chain_of_bare_pointers_is_bounded() {
        let (bytes, owner) = pointing_at_a_chain(MAX_POINTER_HOPS, |prev| {
            vec![0xC0 | (prev >> 8) as u8, prev as u8]
        });
        assert_eq!(
            Message::parse(&bytes),
            Err(WireError::PointerChain { at: owner })
        );
        let (bytes, _) = pointing_at_a_chain(MAX_POINTER_HOPS - 2, |prev| {
            vec![0xC0 | (prev >> 8) as u8, prev as u8]
        });
        assert_eq!(Message::parse(&bytes).unwrap().answers[1].name, name("a.b"));
    }

    #[test]
    fn record_lengths_are_checked() {
        let m = response(
            1,
            "a.b",
            TYPE_A,
            vec![rec("a.b", 1, RData::A(Ipv4Addr::LOCALHOST))],
        );
        let mut bytes = m.encode();
        let rdlen_at = bytes.len() - 6;
        bytes[rdlen_at + 1] = 3; // A record of 3 bytes
        bytes.pop();
        assert!(matches!(
            Message::parse(&bytes),
            Err(WireError::RDataLength {
                rtype: TYPE_A,
                len: 3,
                expected: 4,
                ..
            })
        ));
        // A CNAME whose target runs past its record data.
        let m = response(
            1,
            "a.b",
            TYPE_A,
            vec![rec("a.b", 1, RData::Cname(name("c.d")))],
        );
        let mut bytes = m.encode();
        let rdlen_at = bytes.len() - name("c.d").wire().len() - 1 - 2;
        bytes[rdlen_at + 1] -= 1;
        bytes.push(0);
        assert!(Message::parse(&bytes).is_err());
        // Two questions.
        let mut bytes = response(1, "a.b", TYPE_A, vec![]).encode();
        bytes[5] = 2;
        assert_eq!(
            Message::parse(&bytes),
            Err(WireError::QuestionCount { count: 2 })
        );
    }

    /// Random bytes and random damage to real messages: an error or a
    /// message, never a panic, and never an answer count beyond the bytes.
    #[test]
    fn fuzzed_bytes_never_panic() {
        let mut rng = crate::tests::Rng(0x5EED);
        let base = response(
            9,
            "www.example.com",
            TYPE_A,
            (0..8)
                .map(|i| {
                    rec(
                        "www.example.com",
                        i,
                        RData::A(Ipv4Addr::new(10, 0, 0, i as u8)),
                    )
                })
                .collect(),
        )
        .encode();
        for round in 0..200_000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let mut b = base.clone();
                for _ in 0..1 + rng.below(4) {
                    let i = rng.below(b.len() as u64) as usize;
                    b[i] = rng.next() as u8;
                }
                b.truncate(rng.below(b.len() as u64 + 1) as usize);
                b
            } else {
                (0..rng.below(80)).map(|_| rng.next() as u8).collect()
            };
            if let Ok(m) = Message::parse(&bytes) {
                assert!(m.answers.len() * 11 <= bytes.len());
            }
        }
    }
}
