//! The queries each pod sent that no answer has matched yet.
//!
//! An answer teaches only when it answers a query this pod sent: from the
//! server the query went to, to the address and port it came from, with
//! its id, and with its question (name, type, class; the name's case may
//! differ, as resolvers that randomise it echo it). The query is consumed:
//! a second answer, forged or not, teaches nothing. Per pod and capped, so
//! that a pod flooding queries forgets only its own.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::net::SocketAddr;

use crate::limits::Limits;
use crate::wire::Question;
use crate::NS_PER_S;

/// Where a query went, as its answer must come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct QueryKey {
    /// The pod's address and source port.
    pub client: SocketAddr,
    /// The server's address and port.
    pub server: SocketAddr,
    pub id: u16,
}

/// Why an answer matches no query (each counted by the enforcer).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("no query from this pod with this id, ports and server")]
    NoQuery,
    #[error("the question is not the one the query asked")]
    Question,
    #[error("the query was sent longer ago than the query timeout")]
    Late,
}

struct Sent {
    key: QueryKey,
    question: Question,
    deadline: u64,
}

/// Queries awaiting answers, per pod `P`.
pub struct Pending<P> {
    pods: HashMap<P, VecDeque<Sent>>,
    per_pod: usize,
    timeout_ns: u64,
    /// Queries forgotten because their pod had `pending_per_pod` waiting.
    pub evicted: u64,
}

impl<P: Eq + Hash + Clone> Pending<P> {
    pub fn new(limits: &Limits) -> Self {
        Pending {
            pods: HashMap::new(),
            per_pod: limits.pending_per_pod.max(1),
            timeout_ns: u64::from(limits.query_timeout_s) * NS_PER_S,
            evicted: 0,
        }
    }

    /// A query `pod` sent at `now`. A retransmission (same key) replaces
    /// the earlier one.
    pub fn sent(&mut self, now: u64, pod: &P, key: QueryKey, question: Question) {
        let queue = self.pods.entry(pod.clone()).or_default();
        if let Some(i) = queue.iter().position(|s| s.key == key) {
            queue.remove(i);
        }
        if queue.len() >= self.per_pod {
            queue.pop_front();
            self.evicted += 1;
        }
        queue.push_back(Sent {
            key,
            question,
            deadline: now.saturating_add(self.timeout_ns),
        });
    }

    /// Matches an answer to `pod` (its `key` read off the answer: client
    /// is its destination, server its source) and consumes the query. A
    /// question that differs leaves the query waiting for the real answer.
    pub fn answered(
        &mut self,
        now: u64,
        pod: &P,
        key: &QueryKey,
        question: &Question,
    ) -> Result<(), Mismatch> {
        let queue = self.pods.get_mut(pod).ok_or(Mismatch::NoQuery)?;
        let i = queue
            .iter()
            .position(|s| s.key == *key)
            .ok_or(Mismatch::NoQuery)?;
        if queue[i].question != *question {
            return Err(Mismatch::Question);
        }
        let sent = queue.remove(i).expect("found above");
        if queue.is_empty() {
            self.pods.remove(pod);
        }
        if now > sent.deadline {
            return Err(Mismatch::Late);
        }
        Ok(())
    }

    /// Drops queries whose answer would now be late.
    pub fn expire(&mut self, now: u64) {
        self.pods.retain(|_, queue| {
            // Deadlines grow along a queue: sent in order, same timeout.
            while queue.front().is_some_and(|s| s.deadline < now) {
                queue.pop_front();
            }
            !queue.is_empty()
        });
    }

    /// The pod is gone: its queries go with it.
    pub fn forget(&mut self, pod: &P) {
        self.pods.remove(pod);
    }

    /// Queries waiting, over all pods.
    pub fn len(&self) -> usize {
        self.pods.values().map(VecDeque::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::tests::name;
    use crate::wire::{CLASS_IN, TYPE_A, TYPE_AAAA};

    const S: u64 = NS_PER_S;

    fn key(port: u16, id: u16) -> QueryKey {
        QueryKey {
            client: format!("10.0.0.5:{port}").parse().unwrap(),
            server: "10.96.0.10:53".parse().unwrap(),
            id,
        }
    }

    fn q(n: &str, qtype: u16) -> Question {
        Question {
            name: name(n),
            qtype,
            qclass: CLASS_IN,
        }
    }

    fn pending() -> Pending<&'static str> {
        Pending::new(&Limits {
            pending_per_pod: 3,
            query_timeout_s: 10,
            ..Limits::default()
        })
    }

    #[test]
    fn an_answer_matches_once() {
        let mut p = pending();
        p.sent(0, &"pod", key(5000, 1), q("a.example.com", TYPE_A));
        p.sent(0, &"pod", key(5000, 2), q("a.example.com", TYPE_AAAA));
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 1), &q("A.Example.com", TYPE_A)),
            Ok(())
        );
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 1), &q("a.example.com", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 2), &q("a.example.com", TYPE_AAAA)),
            Ok(())
        );
        assert!(p.is_empty());
    }

    #[test]
    fn every_field_must_match() {
        let mut p = pending();
        p.sent(0, &"pod", key(5000, 1), q("a.example.com", TYPE_A));
        // Another pod, id, client port, server address or port.
        assert_eq!(
            p.answered(S, &"other", &key(5000, 1), &q("a.example.com", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 2), &q("a.example.com", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
        assert_eq!(
            p.answered(S, &"pod", &key(5001, 1), &q("a.example.com", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
        let mut k = key(5000, 1);
        k.server = "10.96.0.11:53".parse().unwrap();
        assert_eq!(
            p.answered(S, &"pod", &k, &q("a.example.com", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
        k.server = "10.96.0.10:5353".parse().unwrap();
        assert_eq!(
            p.answered(S, &"pod", &k, &q("a.example.com", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
        // The right key with another question: refused, and the query
        // still waits for its real answer.
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 1), &q("evil.example.com", TYPE_A)),
            Err(Mismatch::Question)
        );
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 1), &q("a.example.com", TYPE_AAAA)),
            Err(Mismatch::Question)
        );
        assert_eq!(
            p.answered(S, &"pod", &key(5000, 1), &q("a.example.com", TYPE_A)),
            Ok(())
        );
    }

    #[test]
    fn late_answers_and_expiry() {
        let mut p = pending();
        p.sent(0, &"pod", key(5000, 1), q("a.b", TYPE_A));
        p.sent(5 * S, &"pod", key(5000, 2), q("a.b", TYPE_A));
        assert_eq!(
            p.answered(11 * S, &"pod", &key(5000, 1), &q("a.b", TYPE_A)),
            Err(Mismatch::Late)
        );
        p.sent(5 * S, &"pod", key(5000, 3), q("a.b", TYPE_A));
        p.expire(16 * S);
        assert!(p.is_empty());
    }

    #[test]
    fn a_flood_evicts_only_its_own_pod() {
        let mut p = pending();
        p.sent(0, &"victim", key(6000, 7), q("a.b", TYPE_A));
        for id in 0..1000 {
            p.sent(0, &"flooder", key(5000, id), q("a.b", TYPE_A));
        }
        assert_eq!(p.evicted, 997);
        assert_eq!(p.len(), 4);
        assert_eq!(
            p.answered(S, &"victim", &key(6000, 7), &q("a.b", TYPE_A)),
            Ok(())
        );
        // The flooder's last three remain.
        assert_eq!(
            p.answered(S, &"flooder", &key(5000, 999), &q("a.b", TYPE_A)),
            Ok(())
        );
        assert_eq!(
            p.answered(S, &"flooder", &key(5000, 0), &q("a.b", TYPE_A)),
            Err(Mismatch::NoQuery)
        );
    }

    #[test]
    fn a_retransmission_replaces() {
        let mut p = pending();
        p.sent(0, &"pod", key(5000, 1), q("a.b", TYPE_A));
        p.sent(9 * S, &"pod", key(5000, 1), q("a.b", TYPE_A));
        assert_eq!(p.len(), 1);
        assert_eq!(
            p.answered(15 * S, &"pod", &key(5000, 1), &q("a.b", TYPE_A)),
            Ok(())
        );
        p.sent(0, &"pod", key(5000, 1), q("a.b", TYPE_A));
        p.forget(&"pod");
        assert!(p.is_empty());
    }
}
