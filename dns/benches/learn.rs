//! What learning from one answer costs in the learner's own logic, on one
//! core: read the message, match it to the pod's query, follow its chain,
//! match the pod's patterns, update the tables. Not included: receiving
//! the answer from the datapath, writing the map entries, re-injecting the
//! answer (the enforcer's part, measured where it is built).
//!
//! Prints `bench=dns_learn part=userspace answers_per_s= ns_per_answer=
//! addrs_per_answer=` and `bench=dns_learn bytes_per_address= addresses=`
//! (heap per learned address, names and entries included).

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use palisade_dns::wire::{Header, Question, RData, Record, CLASS_IN, TYPE_A, TYPE_CNAME};
use palisade_dns::{resolve, Learned, Limits, Message, Name, Pattern, Pending, QueryKey, NS_PER_S};

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

const PODS: u32 = 100;
const ADDRS: u8 = 4;

fn name(s: &str) -> Name {
    Name::from_labels(s.split('.').map(str::as_bytes)).unwrap()
}

/// The answer to query `i`: a CNAME to an edge name and ADDRS addresses.
fn answer(i: u32) -> (Question, Vec<u8>) {
    let q = Question {
        name: name(&format!("svc{}.api.example.com", i % 1000)),
        qtype: TYPE_A,
        qclass: CLASS_IN,
    };
    let edge = name(&format!("e{}.edge.cdn.net", i % 1000));
    let mut answers = vec![Record {
        name: q.name.clone(),
        rtype: TYPE_CNAME,
        class: CLASS_IN,
        ttl: 300,
        data: RData::Cname(edge.clone()),
    }];
    for a in 0..ADDRS {
        answers.push(Record {
            name: edge.clone(),
            rtype: TYPE_A,
            class: CLASS_IN,
            ttl: 60,
            data: RData::A(Ipv4Addr::from(
                0x0A00_0000 + i * u32::from(ADDRS) + u32::from(a),
            )),
        });
    }
    let m = Message {
        header: Header {
            id: i as u16,
            response: true,
            opcode: 0,
            truncated: false,
            rcode: 0,
        },
        question: q.clone(),
        answers,
    };
    (q, m.encode())
}

fn key(i: u32) -> QueryKey {
    QueryKey {
        client: SocketAddr::new(IpAddr::V4(Ipv4Addr::from(0x0A80_0000 + i % PODS)), 40000),
        server: "10.96.0.10:53".parse().unwrap(),
        id: i as u16,
    }
}

fn main() {
    let rules: Vec<Vec<Pattern>> = (0..9)
        .map(|r| vec![format!("r{r}.example.org").parse().unwrap()])
        .chain([vec!["*.api.example.com".parse().unwrap()]])
        .collect();
    let n: u32 = 200_000;
    let answers: Vec<(Question, Vec<u8>)> = (0..n).map(answer).collect();
    let limits = Limits::default();
    let mut pending = Pending::new(&limits);
    let mut learned = Learned::new(limits);
    let mut rounds = Vec::new();
    for round in 0..3u64 {
        let base = round * 1_000 * NS_PER_S;
        let start = Instant::now();
        let mut entries = 0usize;
        for (i, (q, bytes)) in answers.iter().enumerate() {
            let i = i as u32;
            let pod = i % PODS;
            let now = base + u64::from(i);
            pending.sent(now, &pod, key(i), q.clone());
            let m = Message::parse(bytes).expect("a well-formed answer");
            pending
                .answered(now, &pod, &key(i), &m.question)
                .expect("its query");
            let r = resolve(&m).expect("an answer");
            entries += learned.learn(now, &pod, &rules, &r).changes.len();
        }
        let secs = start.elapsed().as_secs_f64();
        assert!(entries > 0);
        rounds.push(secs);
        // Everything expires before the next round.
        learned.expire(base + 999 * NS_PER_S);
    }
    rounds.sort_by(f64::total_cmp);
    let secs = rounds[1];
    println!(
        "bench=dns_learn part=userspace answers_per_s={:.0} ns_per_answer={:.0} addrs_per_answer={ADDRS}",
        f64::from(n) / secs,
        secs * 1e9 / f64::from(n)
    );

    // Heap per learned address: one name per answer, ADDRS entries each.
    let mut learned = Learned::new(Limits::default());
    let before = LIVE.load(Ordering::Relaxed);
    let count = 20_000u32;
    for i in 0..count {
        let (_, bytes) = answer(i);
        let r = resolve(&Message::parse(&bytes).unwrap()).unwrap();
        learned.learn(0, &(i % PODS), &rules, &r);
    }
    let bytes = LIVE.load(Ordering::Relaxed) - before;
    let addresses = learned.entry_count();
    println!(
        "bench=dns_learn bytes_per_address={:.0} addresses={addresses} names={}",
        bytes as f64 / addresses as f64,
        learned.name_count()
    );
}
