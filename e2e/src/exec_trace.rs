//! How long each run of some programs took, exec to exit, as the kernel's
//! scheduler tracepoints saw it: for timing a CNI plugin that a container
//! runtime execs, with nothing added to the chain (a timing wrapper would
//! be one more exec in the very path it measures). The events go to a
//! tracefs instance of our own, so the node's own tracing is untouched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

/// Where tracefs keeps its instances.
pub const INSTANCES: &str = "/sys/kernel/tracing/instances";

/// The instance a lab's benchmark traces in, found by `palisade-lab
/// clean` when the lab was killed before it could remove it.
pub fn lab_instance(lab_id: &str) -> String {
    format!("palisade-lab-{lab_id}")
}

/// Each traced program's runs, exec to exit.
pub type Runs = BTreeMap<String, Vec<Duration>>;

/// A tracefs instance recording the execs of some programs and their
/// exits.
pub struct ExecTrace {
    dir: PathBuf,
    programs: Vec<String>,
}

impl ExecTrace {
    /// An instance named `name` (`palisade-…`), off until
    /// [`ExecTrace::start`]. `programs` are executables' file names (at
    /// most 15 bytes: the kernel's `comm`, by which an exit is found).
    pub fn new(name: &str, programs: &[&str]) -> Result<ExecTrace> {
        if programs.is_empty() {
            bail!("no program to trace");
        }
        for program in programs {
            if program.is_empty() || program.len() > 15 || program.contains(['"', '/', '*']) {
                bail!("program {program:?}: a file name of at most 15 bytes, as the kernel's comm holds it");
            }
        }
        let dir = Path::new(INSTANCES).join(name);
        std::fs::create_dir(&dir).with_context(|| {
            format!(
                "creating the tracefs instance {} (root, and tracefs mounted)",
                dir.display()
            )
        })?;
        let trace = ExecTrace {
            dir,
            programs: programs.iter().map(|p| p.to_string()).collect(),
        };
        let any = |field: &str, pattern: &dyn Fn(&str) -> String| {
            programs
                .iter()
                .map(|p| format!("{field} {}", pattern(p)))
                .collect::<Vec<_>>()
                .join(" || ")
        };
        trace.write("tracing_on", "0")?;
        // One clock for every CPU: an exec and its exit may be on two.
        trace.write("trace_clock", "mono")?;
        trace.write("buffer_size_kb", "4096")?;
        trace.write(
            "events/sched/sched_process_exec/filter",
            &any("filename", &|p| format!("~ \"*/{p}\"")),
        )?;
        trace.write(
            "events/sched/sched_process_exit/filter",
            &any("comm", &|p| format!("== \"{p}\"")),
        )?;
        for event in ["sched_process_exec", "sched_process_exit"] {
            trace.write(&format!("events/sched/{event}/enable"), "1")?;
        }
        Ok(trace)
    }

    /// Empties the buffer and records from now.
    pub fn start(&self) -> Result<()> {
        self.write("trace", "")?;
        self.write("tracing_on", "1")
    }

    /// Stops recording; returns each run that began and ended while it
    /// recorded, exec to exit, by program (every program has an entry).
    /// Fails if the buffer lost events or a run never ended: a run left
    /// out would bias what the caller measures.
    pub fn stop(&self) -> Result<Runs> {
        self.write("tracing_on", "0")?;
        let text = std::fs::read_to_string(self.dir.join("trace"))
            .with_context(|| format!("reading {}/trace", self.dir.display()))?;
        let mut out = BTreeMap::new();
        for p in &self.programs {
            out.insert(p.clone(), runs(&text, p)?);
        }
        Ok(out)
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let path = self.dir.join(file);
        std::fs::write(&path, value)
            .with_context(|| format!("writing {value:?} to {}", path.display()))
    }
}

impl Drop for ExecTrace {
    fn drop(&mut self) {
        let _ = self.write("tracing_on", "0");
        for event in ["sched_process_exec", "sched_process_exit"] {
            let _ = self.write(&format!("events/sched/{event}/enable"), "0");
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("removing the tracefs instance {}: {e}", self.dir.display());
        }
    }
}

/// Exec-to-exit times of `program` in a tracefs `trace` text: each exec
/// paired with the exit of the same pid (the thread-group leader's, which
/// the exec made). An exit with no exec before it (a run begun before
/// recording) is left out; an exec with no exit is an error.
pub fn runs(trace: &str, program: &str) -> Result<Vec<Duration>> {
    if let Some(counts) = trace
        .lines()
        .find_map(|l| l.strip_prefix("# entries-in-buffer/entries-written: "))
    {
        let (kept, written) = counts
            .split_once(' ')
            .map(|(c, _)| c)
            .unwrap_or(counts)
            .split_once('/')
            .ok_or_else(|| anyhow!("unreadable trace header {counts:?}"))?;
        if kept.trim() != written.trim() {
            bail!("the trace buffer lost events ({kept} kept of {written} written)");
        }
    }
    let mut started: BTreeMap<u32, u64> = BTreeMap::new();
    let mut out = Vec::new();
    for line in trace.lines().filter(|l| !l.starts_with('#')) {
        let Some((head, event)) = line.split_once(": sched_process_") else {
            continue;
        };
        let at = head
            .rsplit(' ')
            .next()
            .and_then(micros)
            .ok_or_else(|| anyhow!("no timestamp in trace line {line:?}"))?;
        let pid = field(event, "pid").ok_or_else(|| anyhow!("no pid in trace line {line:?}"))?;
        if let Some(exec) = event.strip_prefix("exec: ") {
            if field::<String>(exec, "filename")
                .is_some_and(|f| f.ends_with(&format!("/{program}")))
            {
                started.insert(pid, at);
            }
        } else if event.starts_with("exit: ")
            && field::<String>(event, "comm").as_deref() == Some(program)
        {
            if let Some(from) = started.remove(&pid) {
                out.push(Duration::from_micros(at.saturating_sub(from)));
            }
        }
    }
    if !started.is_empty() {
        bail!(
            "{} run(s) of {program} never exited while traced (pids {:?})",
            started.len(),
            started.keys().collect::<Vec<_>>()
        );
    }
    Ok(out)
}

/// `12345.678901` (seconds, microseconds) as microseconds.
fn micros(ts: &str) -> Option<u64> {
    let (s, us) = ts.split_once('.')?;
    if us.len() != 6 {
        return None;
    }
    Some(s.parse::<u64>().ok()? * 1_000_000 + us.parse::<u64>().ok()?)
}

/// The value of `name=` in an event's text (values have no spaces here).
fn field<T: std::str::FromStr>(event: &str, name: &str) -> Option<T> {
    event
        .split(' ')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "\
# tracer: nop
#
# entries-in-buffer/entries-written: 6/6   #P:2
#
#           TASK-PID     CPU#  |||||  TIMESTAMP  FUNCTION
#              | |         |   |||||     |         |
   palisade-cni-700     [000] ..... 100.000100: sched_process_exit: comm=palisade-cni pid=700 prio=120 group_dead=true
   palisade-cni-801     [001] ..... 100.001000: sched_process_exec: filename=/opt/cni/bin/palisade-cni pid=801 old_pid=801
   palisade-cni-802     [000] ..... 100.001500: sched_process_exec: filename=/opt/cni/bin/palisade-cni pid=802 old_pid=802
   palisade-cni-805     [001] ..... 100.004000: sched_process_exit: comm=palisade-cni pid=805 prio=120 group_dead=false
   palisade-cni-801     [001] ..... 100.004250: sched_process_exit: comm=palisade-cni pid=801 prio=120 group_dead=true
   palisade-cni-802     [000] ..... 101.000000: sched_process_exit: comm=palisade-cni pid=802 prio=120 group_dead=true
";

    #[test]
    fn each_exec_is_paired_with_its_own_exit() {
        assert_eq!(
            runs(TRACE, "palisade-cni").unwrap(),
            vec![Duration::from_micros(3250), Duration::from_micros(998_500)]
        );
    }

    #[test]
    fn a_lost_event_or_a_run_that_never_ended_is_an_error() {
        let lost = TRACE.replace("6/6", "5/6");
        let e = runs(&lost, "palisade-cni").unwrap_err();
        assert!(e.to_string().contains("lost events"), "{e}");
        let cut: String = TRACE.lines().take(10).map(|l| format!("{l}\n")).collect();
        let e = runs(&cut, "palisade-cni").unwrap_err();
        assert!(e.to_string().contains("pids [801, 802]"), "{e}");
    }

    #[test]
    fn other_programs_are_not_counted() {
        let other = TRACE.replace(
            "/opt/cni/bin/palisade-cni pid=802",
            "/opt/cni/bin/ptp pid=802",
        );
        assert_eq!(
            runs(&other, "palisade-cni").unwrap(),
            vec![Duration::from_micros(3250)]
        );
    }

    /// The real tracepoints: this test runs a copy of `true` three times
    /// and of `false` once, under names no other process has.
    #[test]
    #[ignore = "needs root"]
    fn times_real_runs() {
        palisade_test_support::require_root();
        let dir = tempfile::tempdir().unwrap();
        let id = std::process::id() % 100_000;
        let (yes, no) = (format!("ptyes{id}"), format!("ptno{id}"));
        for (name, from) in [(&yes, "/bin/true"), (&no, "/bin/false")] {
            std::fs::copy(from, dir.path().join(name)).unwrap();
        }
        let trace = ExecTrace::new(&format!("palisade-test-{id}"), &[&yes, &no]).unwrap();
        trace.start().unwrap();
        let run = |name: &str| {
            std::process::Command::new(dir.path().join(name))
                .status()
                .unwrap()
                .success()
        };
        for _ in 0..3 {
            assert!(run(&yes));
        }
        assert!(!run(&no));
        let took = trace.stop().unwrap();
        assert_eq!(took[&yes].len(), 3, "{took:?}");
        assert_eq!(took[&no].len(), 1, "{took:?}");
        assert!(
            took.values().flatten().all(|t| *t < Duration::from_secs(5)),
            "{took:?}"
        );
    }
}
