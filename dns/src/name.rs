//! DNS names as policies match them.
//!
//! A name is a sequence of labels, compared label by label with ASCII case
//! folded (RFC 4343), never as text: a label may hold any byte, a `.`
//! included, so `a.example` + `com` is not `a` + `example` + `com`. Names
//! are kept lower-cased in their wire form (each label preceded by its
//! length, without the root's empty label), which is compact, cheap to
//! hash, and what the wire reader produces anyway.

use std::fmt;

/// A name's longest wire form, the root's zero byte included (RFC 1035 2.3.4).
pub const MAX_NAME_WIRE_LEN: usize = 255;
/// A label's longest length (RFC 1035 2.3.4).
pub const MAX_LABEL_LEN: usize = 63;

/// A DNS name, lower-cased, in wire form without the root label.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Name {
    wire: Vec<u8>,
}

/// Why labels do not make a name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("label {index} is empty")]
    EmptyLabel { index: usize },
    #[error("label {index} is {len} bytes, longer than {MAX_LABEL_LEN}")]
    LabelTooLong { index: usize, len: usize },
    #[error("the name is {len} bytes on the wire, longer than {MAX_NAME_WIRE_LEN}")]
    TooLong { len: usize },
}

impl Name {
    /// The root name (no labels).
    pub fn root() -> Self {
        Name::default()
    }

    /// A name from its labels, most specific first, case folded.
    pub fn from_labels<'a>(labels: impl IntoIterator<Item = &'a [u8]>) -> Result<Self, NameError> {
        let mut name = Name::root();
        for (index, label) in labels.into_iter().enumerate() {
            name.push(label, index)?;
        }
        Ok(name)
    }

    /// Appends one label (the wire reader's way of building a name).
    pub(crate) fn push(&mut self, label: &[u8], index: usize) -> Result<(), NameError> {
        if label.is_empty() {
            return Err(NameError::EmptyLabel { index });
        }
        if label.len() > MAX_LABEL_LEN {
            return Err(NameError::LabelTooLong {
                index,
                len: label.len(),
            });
        }
        // +1 for this label's length byte, +1 for the root's.
        let len = self.wire.len() + 1 + label.len() + 1;
        if len > MAX_NAME_WIRE_LEN {
            return Err(NameError::TooLong { len });
        }
        self.wire.push(label.len() as u8);
        self.wire.extend(label.iter().map(u8::to_ascii_lowercase));
        Ok(())
    }

    /// The labels, most specific first.
    pub fn labels(&self) -> Labels<'_> {
        Labels { rest: &self.wire }
    }

    pub fn label_count(&self) -> usize {
        self.labels().count()
    }

    /// The wire form without the root label (its length bytes included).
    pub fn wire(&self) -> &[u8] {
        &self.wire
    }

    /// Whether `self` is `base` or lies under it, label-wise.
    pub fn ends_with(&self, base: &Name) -> bool {
        // Walk label boundaries from the front: the suffix must start at one.
        let mut at = 0;
        loop {
            if self.wire[at..] == base.wire[..] {
                return true;
            }
            if at >= self.wire.len() {
                return false;
            }
            at += 1 + self.wire[at] as usize;
        }
    }
}

/// The labels of a [`Name`].
pub struct Labels<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Labels<'a> {
    type Item = &'a [u8];
    fn next(&mut self) -> Option<&'a [u8]> {
        let (&len, rest) = self.rest.split_first()?;
        let (label, rest) = rest.split_at(len as usize);
        self.rest = rest;
        Some(label)
    }
}

/// Presentation form (RFC 1035 5.1): labels joined by `.`, a `.` or `\`
/// inside a label escaped with `\`, other bytes outside printable ASCII as
/// `\DDD`. The root is `.`.
impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.wire.is_empty() {
            return f.write_str(".");
        }
        for (i, label) in self.labels().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            for &b in label {
                match b {
                    b'.' | b'\\' => write!(f, "\\{}", b as char)?,
                    0x21..=0x7e => write!(f, "{}", b as char)?,
                    _ => write!(f, "\\{b:03}")?,
                }
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Name({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(labels: &[&str]) -> Name {
        Name::from_labels(labels.iter().map(|l| l.as_bytes())).unwrap()
    }

    #[test]
    fn case_is_folded_and_labels_kept_apart() {
        assert_eq!(
            name(&["WWW", "Example", "COM"]),
            name(&["www", "example", "com"])
        );
        assert_ne!(name(&["a.example", "com"]), name(&["a", "example", "com"]));
        assert_eq!(name(&["a.example", "com"]).to_string(), "a\\.example.com");
        assert_eq!(name(&["a", "example", "com"]).to_string(), "a.example.com");
        assert_eq!(name(&["x\0y"]).to_string(), "x\\000y");
        assert_eq!(Name::root().to_string(), ".");
    }

    #[test]
    fn ends_with_is_label_wise() {
        let base = name(&["example", "com"]);
        assert!(name(&["example", "com"]).ends_with(&base));
        assert!(name(&["a", "b", "example", "com"]).ends_with(&base));
        assert!(!name(&["myexample", "com"]).ends_with(&base));
        assert!(!name(&["com"]).ends_with(&base));
        // A label that holds "x.example" then "com": not under example.com.
        assert!(!name(&["x.example", "com"]).ends_with(&base));
        // Bytes that look like a label boundary inside a label.
        let tricky = Name::from_labels([&b"a\x07example"[..], b"com"]).unwrap();
        assert!(!tricky.ends_with(&base));
        assert!(name(&["a"]).ends_with(&Name::root()));
    }

    #[test]
    fn limits_are_named() {
        assert_eq!(
            Name::from_labels([&b""[..]]),
            Err(NameError::EmptyLabel { index: 0 })
        );
        let long = [b'a'; 64];
        assert_eq!(
            Name::from_labels([&long[..]]),
            Err(NameError::LabelTooLong { index: 0, len: 64 })
        );
        let l63 = [b'a'; 63];
        // Four 63-byte labels: 4 * 64 + 1 = 257 bytes on the wire.
        assert_eq!(
            Name::from_labels([&l63[..], &l63, &l63, &l63]),
            Err(NameError::TooLong { len: 257 })
        );
        // Three 63-byte labels and one of 61: exactly 255.
        let l61 = [b'a'; 61];
        assert!(Name::from_labels([&l63[..], &l63, &l63, &l61]).is_ok());
    }
}
