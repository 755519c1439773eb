//! How the lab starts pods. `lab` (the default): the lab makes each pod's
//! network namespace and runs the CNI chain itself, as libcni would.
//! `containerd`: a real containerd per node starts every pod over the CRI,
//! as the kubelet asks it to, and its CRI plugin runs the chain.

pub mod cgroups;
pub mod containerd;
pub mod cri;
pub mod image;
pub mod mounts;
pub mod sandbox;
pub mod sweep;

/// Who starts the lab's pods (scenario key `runtime:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PodRuntime {
    #[default]
    Lab,
    Containerd,
}

impl PodRuntime {
    pub const NAMES: &'static str = "lab or containerd";

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "lab" => Some(Self::Lab),
            "containerd" => Some(Self::Containerd),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Lab => "lab",
            Self::Containerd => "containerd",
        }
    }
}

impl std::fmt::Display for PodRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_parse_by_name() {
        for r in [PodRuntime::Lab, PodRuntime::Containerd] {
            assert_eq!(PodRuntime::parse(r.as_str()), Some(r));
        }
        assert_eq!(PodRuntime::parse("docker"), None);
        assert_eq!(PodRuntime::default(), PodRuntime::Lab);
    }
}
