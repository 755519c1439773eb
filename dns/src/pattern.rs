//! A policy's `domainNames` entry and what it matches.
//!
//! The grammar is the CRDs' (upstream ClusterNetworkPolicy, AWS's
//! ApplicationNetworkPolicy and ClusterNetworkPolicy share it): an optional
//! `*.` prefix, two labels or more, an optional trailing dot. `*` stands
//! for one label or more, whole labels only: `*.example.com` matches
//! `www.example.com` and `a.b.example.com`, never `example.com`. Matching
//! ignores ASCII case; the pattern is kept lower-cased.

use std::fmt;
use std::str::FromStr;

use crate::name::{Name, NameError};

/// The CRDs' validation pattern for one entry, as they write it.
pub const DOMAIN_PATTERN: &str = r"^(\*\.)?([a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.)+[a-zA-z0-9]([-a-zA-Z0-9_]*[a-zA-Z0-9])?\.?$";

/// Whether `s` matches [`DOMAIN_PATTERN`], exactly as the API server would
/// decide it (its `A-z` range also admits the six characters between `Z`
/// and `a` as a label's first character).
pub fn is_domain_name(s: &str) -> bool {
    let s = s.strip_prefix("*.").unwrap_or(s);
    let s = s.strip_suffix('.').unwrap_or(s);
    let first = |c: u8| c.is_ascii_digit() || (b'A'..=b'z').contains(&c);
    let middle = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
    let label = |l: &str| match l.as_bytes() {
        [] => false,
        [c] => first(*c),
        [c, mid @ .., last] => {
            first(*c) && mid.iter().all(|m| middle(*m)) && last.is_ascii_alphanumeric()
        }
    };
    let mut labels = 0;
    for l in s.split('.') {
        if !label(l) {
            return false;
        }
        labels += 1;
    }
    labels >= 2
}

/// One `domainNames` entry.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pattern {
    /// Matches this name only.
    Exact(Name),
    /// `*.` + this name: matches every name under it, one label deeper or more.
    Subdomains(Name),
}

/// Why a string is not a `domainNames` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("{text:?} does not match '{DOMAIN_PATTERN}'")]
    Grammar { text: String },
    #[error("{text:?}: {source}")]
    Name { text: String, source: NameError },
}

impl Pattern {
    pub fn matches(&self, name: &Name) -> bool {
        match self {
            Pattern::Exact(n) => n == name,
            Pattern::Subdomains(base) => {
                name.label_count() > base.label_count() && name.ends_with(base)
            }
        }
    }

    /// The name the pattern is written on (without `*.`).
    pub fn base(&self) -> &Name {
        match self {
            Pattern::Exact(n) | Pattern::Subdomains(n) => n,
        }
    }
}

impl FromStr for Pattern {
    type Err = PatternError;
    fn from_str(text: &str) -> Result<Self, PatternError> {
        if !is_domain_name(text) {
            return Err(PatternError::Grammar { text: text.into() });
        }
        let (wild, rest) = match text.strip_prefix("*.") {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let rest = rest.strip_suffix('.').unwrap_or(rest);
        let name = Name::from_labels(rest.split('.').map(str::as_bytes)).map_err(|source| {
            PatternError::Name {
                text: text.into(),
                source,
            }
        })?;
        Ok(if wild {
            Pattern::Subdomains(name)
        } else {
            Pattern::Exact(name)
        })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Exact(n) => write!(f, "{n}"),
            Pattern::Subdomains(n) => write!(f, "*.{n}"),
        }
    }
}

impl fmt::Debug for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Pattern({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Name {
        Name::from_labels(s.split('.').map(str::as_bytes)).unwrap()
    }

    fn p(s: &str) -> Pattern {
        s.parse().unwrap()
    }

    #[test]
    fn the_apis_examples() {
        // The examples the API's documentation gives, in order.
        let exact = p("kubernetes.io");
        assert!(exact.matches(&name("kubernetes.io")));
        for other in [
            "www.kubernetes.io",
            "blog.kubernetes.io",
            "my-kubernetes.io",
            "wikipedia.org",
        ] {
            assert!(!exact.matches(&name(other)), "{other}");
        }
        let blog = p("blog.kubernetes.io");
        assert!(blog.matches(&name("blog.kubernetes.io")));
        assert!(!blog.matches(&name("www.kubernetes.io")));
        assert!(!blog.matches(&name("kubernetes.io")));
        let wild = p("*.kubernetes.io");
        for yes in [
            "www.kubernetes.io",
            "blog.kubernetes.io",
            "latest.blog.kubernetes.io",
        ] {
            assert!(wild.matches(&name(yes)), "{yes}");
        }
        for no in [
            "kubernetes.io",
            "wikipedia.org",
            "wwwkubernetes.io",
            "kubernetes.io.evil.com",
        ] {
            assert!(!wild.matches(&name(no)), "{no}");
        }
    }

    #[test]
    fn case_and_trailing_dot() {
        assert_eq!(p("Example.COM."), p("example.com"));
        assert!(p("*.Example.com").matches(&name("WWW.EXAMPLE.COM")));
        assert_eq!(p("*.Example.com.").to_string(), "*.example.com");
    }

    #[test]
    fn is_domain_name_is_the_crds_pattern() {
        // "[a.b": the pattern's `A-z` admits `[` as a first character.
        for ok in [
            "example.com",
            "*.example.com",
            "a.b.c.",
            "a_b.example.com",
            "x.y",
            "[a.b",
        ] {
            assert!(is_domain_name(ok), "{ok}");
        }
        for bad in [
            "example", "-a.com", "a-.com", "a..b", "*.", "a.b-", "a b.com", "",
        ] {
            assert!(!is_domain_name(bad), "{bad}");
        }
    }

    #[test]
    fn grammar() {
        for bad in [
            "",
            "com",
            "*.com",
            "*",
            "*.",
            ".example.com",
            "example..com",
            "-a.com",
            "a-.com",
            "a.com-",
            "a b.com",
            "*.*.com",
            "a.*.com",
            "example.com..",
            "ex*ample.com",
            "a.com/x",
        ] {
            assert!(
                matches!(bad.parse::<Pattern>(), Err(PatternError::Grammar { .. })),
                "{bad:?}"
            );
        }
        for good in ["a.b", "1.2", "a_b.com", "x-y.z", "_a.com", "*.a.b", "a.b."] {
            assert!(good.parse::<Pattern>().is_ok(), "{good:?}");
        }
        // The grammar bounds neither a label nor the name: the wire does.
        let long = format!("{}.com", "a".repeat(64));
        assert!(matches!(
            long.parse::<Pattern>(),
            Err(PatternError::Name {
                source: NameError::LabelTooLong { .. },
                ..
            })
        ));
    }

    #[test]
    fn wildcard_depth_exhaustively() {
        // Every name of up to four labels over a small alphabet, against
        // every pattern over it: the rule read straight off the API.
        let alphabet = ["a", "b", "com"];
        let mut names = vec![vec![]];
        for _ in 0..4 {
            let mut longer = Vec::new();
            for n in &names {
                for l in alphabet {
                    let mut m: Vec<&str> = n.clone();
                    m.push(l);
                    longer.push(m);
                }
            }
            names.extend(longer);
        }
        names.sort();
        names.dedup();
        for base in names.iter().filter(|n| n.len() >= 2) {
            let text = base.join(".");
            let exact = p(&text);
            let wild = p(&format!("*.{text}"));
            for n in names.iter().filter(|n| !n.is_empty()) {
                let candidate = name(&n.join("."));
                let under = n.len() > base.len() && n[n.len() - base.len()..] == base[..];
                assert_eq!(exact.matches(&candidate), n == base, "{text} vs {n:?}");
                assert_eq!(wild.matches(&candidate), under, "*.{text} vs {n:?}");
            }
        }
    }
}
