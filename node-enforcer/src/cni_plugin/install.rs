//! `palisade-cni install` and `palisade-cni uninstall`: put the plugin on a
//! node and chain it into the node's CNI network configuration, as the
//! DaemonSet's init container does, and take it out again.
//!
//! The runtime (containerd, CRI-O) uses the first configuration file of its
//! conf dir as libcni lists them ([`conf_files`]). Palisade does not replace that network:
//! it appends itself to the file's `plugins` list, after the interface and
//! IPAM plugins, so the pod's interface exists when palisade-cni runs.
//!
//! Both directions are idempotent, and touch nothing but our own entry: a
//! second install changes nothing, an install over an older entry of ours
//! replaces it in place, and uninstall removes our entries from every file
//! of the conf dir and leaves the other plugins as they were (and the
//! binary, while any file still names it).
//!
//! Files are replaced atomically (write to a new temporary file in the same
//! directory, fsync, rename), so the runtime never reads half a file; a run
//! holds an flock on the conf dir from its first read to its last rename,
//! so two runs never mix their edits; and a file that another writer
//! changed between our read and our rename is read and edited again, not
//! overwritten. A symlinked file is edited where the link points, which
//! stays a link; an edited file keeps its mode and owner.
//!
//! A plain `.conf` (one plugin, no list) cannot be chained into; it is
//! refused with an error that says so rather than rewritten into a list
//! behind the operator's back. So are a list whose cniVersion the plugin
//! does not speak and options (`--timeout-seconds`, `--enforcer-socket`)
//! the plugin would refuse, by the plugin's own rules and before anything
//! is written: either would fail every ADD on the node.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{json, Map, Value};

use super::config;

/// The `type` of our entry, which is also the binary's name in the CNI bin dir.
pub const PLUGIN_TYPE: &str = "palisade-cni";

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InstallError {
    #[error("{0}")]
    Usage(String),
    #[error("no CNI network configuration in {0} (looked for *.conflist, *.conf, *.json)")]
    NoConfig(String),
    #[error("{path}: {reason}")]
    Config { path: String, reason: String },
    #[error("{0}")]
    Io(String),
    /// install-seccomp: `--from` holds another profile than the
    /// content-addressed `--name` says, and the node has none of the
    /// name's content to keep (hashes: the name's 16 hex digits).
    #[error(
        "{target}: named for the seccomp profile with sha256 {expected}…, but {from} holds \
         another (sha256 {found}…) and the node's file {on_node}: the ConfigMap was changed \
         by an upgrade of the chart, and this pod's version's profile is not on the node; \
         nothing written"
    )]
    ProfileMismatch {
        target: String,
        expected: String,
        from: String,
        found: String,
        /// What the node's file is: missing, unreadable, or its hash.
        on_node: String,
    },
}

/// What `install` or `uninstall` was asked to do, from the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub conf_dir: PathBuf,
    /// A file name in `conf_dir`; `None`: the file the runtime uses.
    pub conf_file: Option<String>,
    /// Where to copy this binary; `None`: leave binaries alone.
    pub bin_dir: Option<PathBuf>,
    pub enforcer_socket: String,
    pub timeout_seconds: u64,
    /// `install --watch`: install, then chain again whenever the conf dir
    /// changes ([`super::watch`]).
    pub watch: bool,
}

pub fn parse_args(args: &[String]) -> Result<Options, InstallError> {
    let mut opts = Options {
        conf_dir: PathBuf::from("/etc/cni/net.d"),
        conf_file: None,
        bin_dir: None,
        enforcer_socket: super::DEFAULT_ENFORCER_SOCKET.to_string(),
        timeout_seconds: super::DEFAULT_TIMEOUT_SECONDS,
        watch: false,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| InstallError::Usage(format!("{name} needs a value")))
        };
        match flag.as_str() {
            "--conf-dir" => opts.conf_dir = PathBuf::from(value(flag)?),
            "--conf-file" => opts.conf_file = Some(value(flag)?),
            "--bin-dir" => opts.bin_dir = Some(PathBuf::from(value(flag)?)),
            "--enforcer-socket" => opts.enforcer_socket = value(flag)?,
            "--watch" => opts.watch = true,
            "--timeout-seconds" => {
                let v = value(flag)?;
                opts.timeout_seconds = v.parse().map_err(|_| {
                    InstallError::Usage(format!("--timeout-seconds: {v:?} is not a number"))
                })?;
            }
            other => {
                return Err(InstallError::Usage(format!(
                    "unknown flag {other} (known: --conf-dir DIR, --conf-file NAME, \
                     --bin-dir DIR, --enforcer-socket PATH, --timeout-seconds N, --watch)"
                )))
            }
        }
    }
    if let Some(name) = &opts.conf_file {
        if name.contains('/') {
            return Err(InstallError::Usage(format!(
                "--conf-file {name:?} must be a file name in --conf-dir, not a path"
            )));
        }
    }
    Ok(opts)
}

/// Our entry as `opts` asks for it, checked by the plugin's own rules for
/// its options: an entry the plugin refuses would fail every ADD on the
/// node.
pub fn checked_entry(opts: &Options) -> Result<Value, InstallError> {
    config::enforcer_socket(Some(opts.enforcer_socket.clone()))
        .map_err(|e| InstallError::Usage(format!("--enforcer-socket: {}", e.msg)))?;
    config::timeout(Some(opts.timeout_seconds))
        .map_err(|e| InstallError::Usage(format!("--timeout-seconds: {}", e.msg)))?;
    Ok(entry(&opts.enforcer_socket, opts.timeout_seconds))
}

/// Our entry in a plugin list.
pub fn entry(enforcer_socket: &str, timeout_seconds: u64) -> Value {
    json!({
        "type": PLUGIN_TYPE,
        "enforcerSocket": enforcer_socket,
        "timeoutSeconds": timeout_seconds,
    })
}

fn is_ours(plugin: &Value) -> bool {
    plugin.get("type").and_then(Value::as_str) == Some(PLUGIN_TYPE)
}

fn plugins_of<'a>(conf: &'a mut Value, path: &str) -> Result<&'a mut Vec<Value>, InstallError> {
    let bad = |reason: &str| InstallError::Config {
        path: path.to_string(),
        reason: reason.to_string(),
    };
    let object: &mut Map<String, Value> = conf
        .as_object_mut()
        .ok_or_else(|| bad("not a JSON object"))?;
    if !object.contains_key("plugins") {
        return Err(bad(
            "a single-plugin configuration (no \"plugins\" list) cannot be chained into; \
             convert it to a .conflist or name one with --conf-file",
        ));
    }
    object
        .get_mut("plugins")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad("\"plugins\" is not a list"))
}

/// The configuration with our entry last in its plugin list (replacing an
/// older entry of ours in place), and whether that changed anything.
pub fn chain(conf: &Value, ours: &Value, path: &str) -> Result<(Value, bool), InstallError> {
    let (conf, chained) = chain_as(conf, ours, path, Keep::OnlyOurs)?;
    Ok((conf, chained != Chained::Already))
}

/// Which entry of ours a chained list may keep as it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Only `ours` exactly: an install puts its own options in place.
    OnlyOurs,
    /// Any single entry of ours, last: the watch's re-chains. Two pods of
    /// the DaemonSet overlap in a rollout that changes our options; each
    /// replacing the other's entry would make their watches rewrite the
    /// file after each other forever. The new pod's install (its init
    /// container) puts the new options in place.
    AnyOfOurs,
}

/// What [`chain_as`] did to a plugin list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chained {
    /// Our entry was there, alone and last: nothing to write.
    Already,
    /// The list had no entry of ours: it was appended.
    Appended,
    /// An entry of ours was stale, not last, or not alone: it was put last.
    Replaced,
}

pub(super) fn chain_as(
    conf: &Value,
    ours: &Value,
    path: &str,
    keep: Keep,
) -> Result<(Value, Chained), InstallError> {
    let mut conf = conf.clone();
    // The runtime hands each plugin the list's cniVersion.
    let version = conf.get("cniVersion").cloned();
    let plugins = plugins_of(&mut conf, path)?;
    let refused = |reason: String| InstallError::Config {
        path: path.to_string(),
        reason: format!("{reason}; chained in, palisade-cni would fail every pod's ADD"),
    };
    match version.as_ref().and_then(Value::as_str) {
        Some(v) if !v.is_empty() => {
            config::check_version(v).map_err(|e| refused(format!("{} ({})", e.msg, e.details)))?
        }
        _ => {
            return Err(refused(format!(
                "cniVersion is {} (supported: {})",
                version.map_or("missing".to_string(), |v| v.to_string()),
                config::SUPPORTED_VERSIONS.join(", ")
            )))
        }
    }
    if plugins.iter().filter(|p| !is_ours(p)).count() == 0 {
        return Err(InstallError::Config {
            path: path.to_string(),
            reason: "the plugin list has no interface plugin for palisade-cni to follow".into(),
        });
    }
    let existing: Vec<usize> = (0..plugins.len())
        .filter(|&i| is_ours(&plugins[i]))
        .collect();
    let chained = match existing.as_slice() {
        [] => {
            plugins.push(ours.clone());
            Chained::Appended
        }
        // Exactly one entry of ours, already last (and current, unless
        // any entry of ours will do).
        [i] if *i == plugins.len() - 1 && (keep == Keep::AnyOfOurs || plugins[*i] == *ours) => {
            Chained::Already
        }
        _ => {
            plugins.retain(|p| !is_ours(p));
            plugins.push(ours.clone());
            Chained::Replaced
        }
    };
    Ok((conf, chained))
}

/// The configuration without any entry of ours, and whether it had one.
pub fn unchain(conf: &Value, path: &str) -> Result<(Value, bool), InstallError> {
    let mut conf = conf.clone();
    let plugins = plugins_of(&mut conf, path)?;
    let before = plugins.len();
    plugins.retain(|p| !is_ours(p));
    let changed = plugins.len() != before;
    Ok((conf, changed))
}

/// The extensions containerd and CRI-O pass to libcni's `ConfFiles`.
const CONF_EXTENSIONS: &[&str] = &[".conf", ".conflist", ".json"];

/// One entry of a conf dir, as `os.ReadDir` reports it to libcni: the type
/// is the entry's own, a symlink's not followed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub is_dir: bool,
}

/// libcni's test of a name: its last extension (Go's `filepath.Ext`, so
/// `.conf` itself counts and `a.conflist.bak` does not) is one it loads.
pub fn is_conf_name(name: &str) -> bool {
    name.rfind('.')
        .is_some_and(|i| CONF_EXTENSIONS.contains(&&name[i..]))
}

/// The configuration files of a conf dir as libcni's `ConfFiles` lists them
/// and containerd and CRI-O sort them: every entry but directories (symlinks
/// included), dot-files NOT skipped, in byte order of their names.
pub fn conf_files(entries: &[DirEntry]) -> Vec<&String> {
    let mut files: Vec<&String> = entries
        .iter()
        .filter(|e| !e.is_dir && is_conf_name(&e.name))
        .map(|e| &e.name)
        .collect();
    files.sort();
    files
}

/// The runtime's choice: the first of [`conf_files`].
pub fn runtime_choice(entries: &[DirEntry]) -> Option<&String> {
    conf_files(entries).first().copied()
}

fn read_conf_dir(dir: &Path) -> Result<Vec<DirEntry>, InstallError> {
    let reading = |e| io(format!("reading {}", dir.display()), e);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(reading)? {
        let entry = entry.map_err(reading)?;
        out.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            is_dir: entry.file_type().map_err(reading)?.is_dir(),
        });
    }
    Ok(out)
}

fn io(what: impl std::fmt::Display, e: std::io::Error) -> InstallError {
    InstallError::Io(format!("{what}: {e}"))
}

pub(super) fn config_path(opts: &Options) -> Result<PathBuf, InstallError> {
    if let Some(name) = &opts.conf_file {
        return Ok(opts.conf_dir.join(name));
    }
    let entries = read_conf_dir(&opts.conf_dir)?;
    runtime_choice(&entries)
        .map(|n| opts.conf_dir.join(n))
        .ok_or_else(|| InstallError::NoConfig(opts.conf_dir.display().to_string()))
}

/// How many times an edit starts over because another writer changed the
/// file under it, before it gives up.
const EDIT_ATTEMPTS: usize = 3;

/// An exclusive flock on a conf dir, held while palisade-cni reads, edits
/// and replaces its files (and installs or removes the binary), so two runs
/// (an init container restarted while the last one still runs, an operator
/// by hand) never publish a mix of their edits. The lock is on the directory
/// itself, not on a lock file: libcni lists dot-files too, and a file left
/// in the conf dir could not be removed safely while another run waits on it.
pub struct DirLock {
    _dir: File,
}

pub fn lock_dir(dir: &Path) -> Result<DirLock, InstallError> {
    let file =
        File::open(dir).map_err(|e| io(format!("opening {} to lock it", dir.display()), e))?;
    loop {
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return Ok(DirLock { _dir: file });
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(io(format!("locking {}", dir.display()), e));
        }
    }
}

/// A new file beside `dest` for its next contents, opened O_EXCL: never a
/// file another run (or a crashed one) left, which O_TRUNC would reset
/// under it. The pid alone repeats (it is 1 in every container): a counter
/// tells this process's files apart, RandomState's keys other processes'.
fn create_temp(dest: &Path) -> Result<(PathBuf, File), InstallError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let dir = dest.parent().unwrap_or(Path::new("."));
    let name = dest.file_name().unwrap_or_default().to_string_lossy();
    for _ in 0..8 {
        let mut nonce = RandomState::new().build_hasher();
        nonce.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        // Its last extension is none libcni loads (it does not skip dot-files).
        let tmp = dir.join(format!(
            ".{name}.palisade-{}-{:016x}",
            std::process::id(),
            nonce.finish()
        ));
        match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(file) => return Ok((tmp, file)),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            // Named by its destination: the temporary name is new each
            // time, and the watch reports a failure again only when its
            // text changes.
            Err(e) => {
                return Err(io(
                    format!("creating a temporary file for {}", dest.display()),
                    e,
                ))
            }
        }
    }
    Err(InstallError::Io(format!(
        "creating a temporary file for {}: every name tried exists",
        dest.display()
    )))
}

/// `dest`'s next contents, written and synced beside it, not yet in place;
/// removed on drop unless published, so no error path leaves it behind.
struct Staged {
    tmp: PathBuf,
    published: bool,
}

impl Staged {
    /// `owner`: the uid and gid to give it; `None`: ours.
    fn new(
        dest: &Path,
        bytes: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<Self, InstallError> {
        let (tmp, mut file) = create_temp(dest)?;
        let staged = Staged {
            tmp,
            published: false,
        };
        // Named by its destination, as in create_temp.
        let shown = format!("the temporary file for {}", dest.display());
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::fchown(&file, Some(uid), Some(gid))
                .map_err(|e| io(format!("chown {uid}:{gid} {shown}"), e))?;
        }
        // fchmod, not the open's mode: the umask must not narrow it; and
        // after fchown, which clears set-id bits.
        file.write_all(bytes)
            .and_then(|_| file.set_permissions(std::fs::Permissions::from_mode(mode)))
            .and_then(|_| file.sync_all())
            .map_err(|e| io(format!("writing {shown}"), e))?;
        Ok(staged)
    }

    /// Renames it over `dest`: a reader sees the old file or the new one,
    /// never a mix, and the new one survives a crash.
    fn publish(mut self, dest: &Path) -> Result<(), InstallError> {
        std::fs::rename(&self.tmp, dest)
            .map_err(|e| io(format!("replacing {}", dest.display()), e))?;
        self.published = true;
        let dir = dest.parent().unwrap_or(Path::new("."));
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| io(format!("syncing {}", dir.display()), e))
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Replaces `path` with `bytes` atomically (see [`Staged::publish`]).
pub(super) fn replace_atomically(path: &Path, bytes: &[u8], mode: u32) -> Result<(), InstallError> {
    Staged::new(path, bytes, mode, None)?.publish(path)
}

/// A file as read, and what tells whether it changed since.
#[derive(PartialEq)]
struct Snapshot {
    bytes: Vec<u8>,
    dev: u64,
    ino: u64,
    mode: u32,
    uid: u32,
    gid: u32,
}

fn snapshot(path: &Path) -> Result<Snapshot, InstallError> {
    let reading = |e| io(format!("reading {}", path.display()), e);
    // One open file for both: a rename between a stat and a read cannot
    // pair one file's identity with another's contents.
    let mut file = File::open(path).map_err(reading)?;
    let meta = file.metadata().map_err(reading)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(reading)?;
    Ok(Snapshot {
        bytes,
        dev: meta.dev(),
        ino: meta.ino(),
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

fn parse_conf(bytes: &[u8], shown: &str) -> Result<Value, InstallError> {
    serde_json::from_slice(bytes).map_err(|e| InstallError::Config {
        path: shown.to_string(),
        reason: format!("not valid JSON: {e}"),
    })
}

fn read_conf(path: &Path) -> Result<(Value, String), InstallError> {
    let shown = path.display().to_string();
    let conf = parse_conf(&snapshot(path)?.bytes, &shown)?;
    Ok((conf, shown))
}

/// `path` if it is not a symlink, else the file it finally points to.
pub(super) fn resolve(path: &Path) -> Result<PathBuf, InstallError> {
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| io(format!("reading {}", path.display()), e))?;
    if !meta.file_type().is_symlink() {
        return Ok(path.to_path_buf());
    }
    std::fs::canonicalize(path)
        .map_err(|e| io(format!("following the symlink {}", path.display()), e))
}

type Edit<'a> = &'a dyn Fn(&Value, &str) -> Result<(Value, bool), InstallError>;

/// What [`edit_file`] did to one file.
pub(super) struct Edited {
    /// The file as named (`link -> target` for a symlink).
    pub(super) shown: String,
    /// Whether new contents were published.
    pub(super) updated: bool,
}

impl Edited {
    fn line(&self) -> String {
        let what = if self.updated { "updated" } else { "unchanged" };
        format!("{}: {what}", self.shown)
    }
}

/// Reads `path`, edits it and publishes the result, unless the file changed
/// between the read and the rename: the primary CNI's agent re-rendering
/// its list then, and publishing would silently undo its write. The edit
/// then starts over from the new contents. The caller holds the conf dir's
/// [`DirLock`]; `before_publish` lets tests act in the window.
fn edit_file(
    path: &Path,
    edit: Edit<'_>,
    before_publish: &mut dyn FnMut(&Path),
) -> Result<Edited, InstallError> {
    let mut shown = path.display().to_string();
    for _ in 0..EDIT_ATTEMPTS {
        // A symlinked list is edited where it points, in that directory:
        // replacing the link with a file would cut whoever maintains the
        // target (a vendor's agent, config management) off from the
        // runtime, and refusing it would leave the node unenforced.
        let target = resolve(path)?;
        if target != path {
            shown = format!("{} -> {}", path.display(), target.display());
        }
        let seen = snapshot(&target)?;
        let (new, changed) = edit(&parse_conf(&seen.bytes, &shown)?, &shown)?;
        if !changed {
            return Ok(Edited {
                shown,
                updated: false,
            });
        }
        let mut bytes = serde_json::to_vec_pretty(&new).expect("a JSON value serializes");
        bytes.push(b'\n');
        // The file's own mode and owner, not ours: it is still the vendor's.
        let staged = Staged::new(&target, &bytes, seen.mode, Some((seen.uid, seen.gid)))?;
        before_publish(&target);
        // As late as it can be; a writer that ignores our lock can still
        // land between this and the rename, but not between read and edit.
        if resolve(path)? != target || snapshot(&target)? != seen {
            continue;
        }
        staged.publish(&target)?;
        return Ok(Edited {
            shown,
            updated: true,
        });
    }
    Err(InstallError::Config {
        path: shown,
        reason: format!(
            "changed by another writer during each of {EDIT_ATTEMPTS} attempts to edit it; \
             nothing was written (run again once it settles)"
        ),
    })
}

/// Copies this binary into the CNI bin dir, then chains it into the
/// network configuration; in that order, so the runtime never finds an
/// entry whose binary is missing.
pub fn install(opts: &Options, own_binary: &Path) -> Result<Vec<String>, InstallError> {
    Ok(install_with(opts, own_binary, Keep::OnlyOurs, &mut |_| {})?.lines)
}

/// What one install did.
#[derive(Debug, Clone)]
pub struct Installed {
    /// What `install` prints: a line for the binary (with a bin dir) and
    /// one for the configuration file.
    pub lines: Vec<String>,
    /// The configuration file, as named (`link -> target` for a symlink).
    pub file: String,
    /// What it did to the file's plugin list (the attempt it published).
    pub chained: Chained,
    /// Whether it wrote anything: the binary or the file.
    pub wrote: bool,
}

pub(super) fn install_with(
    opts: &Options,
    own_binary: &Path,
    keep: Keep,
    before_publish: &mut dyn FnMut(&Path),
) -> Result<Installed, InstallError> {
    let ours = checked_entry(opts)?;
    // Held over the binary too: an uninstall must not remove it between
    // our copy and our entry.
    let _lock = lock_dir(&opts.conf_dir)?;
    // A list that cannot take our entry is refused before anything is
    // written, the binary included.
    let path = config_path(opts)?;
    let (conf, shown) = read_conf(&path)?;
    chain_as(&conf, &ours, &shown, keep)?;
    let mut lines = Vec::new();
    let mut wrote = false;
    if let Some(bin_dir) = &opts.bin_dir {
        let target = bin_dir.join(PLUGIN_TYPE);
        if same_contents(own_binary, &target)? {
            lines.push(format!("{}: unchanged", target.display()));
        } else {
            let bytes = std::fs::read(own_binary)
                .map_err(|e| io(format!("reading {}", own_binary.display()), e))?;
            replace_atomically(&target, &bytes, 0o755)?;
            lines.push(format!("{}: installed", target.display()));
            wrote = true;
        }
    }
    let chained = std::cell::Cell::new(Chained::Already);
    let edited = edit_file(
        &path,
        &|conf, path| {
            let (new, what) = chain_as(conf, &ours, path, keep)?;
            chained.set(what);
            Ok((new, what != Chained::Already))
        },
        before_publish,
    )?;
    lines.push(edited.line());
    Ok(Installed {
        lines,
        wrote: wrote || edited.updated,
        chained: chained.get(),
        file: edited.shown,
    })
}

/// Whether `installed` (absent: no) has the bytes of `own`, compared a
/// block at a time: the watch asks on every change of the conf dir, and
/// two copies of the binary need not be in memory for that.
fn same_contents(own: &Path, installed: &Path) -> Result<bool, InstallError> {
    let reading = |path: &Path| {
        let shown = path.display().to_string();
        move |e| io(format!("reading {shown}"), e)
    };
    let mut a = File::open(own).map_err(reading(own))?;
    let mut b = match File::open(installed) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(reading(installed)(e)),
    };
    let len = |f: &File, path: &Path| f.metadata().map(|m| m.len()).map_err(reading(path));
    if len(&a, own)? != len(&b, installed)? {
        return Ok(false);
    }
    let (mut x, mut y) = (vec![0u8; 64 << 10], vec![0u8; 64 << 10]);
    loop {
        let n = read_full(&mut a, &mut x).map_err(reading(own))?;
        let m = read_full(&mut b, &mut y).map_err(reading(installed))?;
        if x[..n] != y[..m] {
            return Ok(false);
        }
        if n == 0 {
            return Ok(true);
        }
    }
}

/// Fills `buf` unless the file ends first; the bytes read.
fn read_full(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// What a configuration file says of palisade-cni.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reference {
    None,
    /// An entry of its plugin list, which [`unchain`] removes.
    InList,
    /// Anywhere else (a single-plugin config of our type, a delegate, a
    /// file that is not JSON): not ours to edit, but the runtime may still
    /// run the binary for it.
    Other,
}

fn reference_in(path: &Path) -> Result<Reference, InstallError> {
    let bytes = match snapshot(path) {
        Ok(seen) => seen.bytes,
        // Listed, then gone or a dangling link: nothing the runtime can run.
        Err(_) if !path.exists() => return Ok(Reference::None),
        Err(e) => return Err(e),
    };
    let in_list = serde_json::from_slice::<Value>(&bytes).is_ok_and(|conf| {
        conf.get("plugins")
            .and_then(Value::as_array)
            .is_some_and(|plugins| plugins.iter().any(is_ours))
    });
    let quoted = format!("\"{PLUGIN_TYPE}\"");
    Ok(if in_list {
        Reference::InList
    } else if bytes.windows(quoted.len()).any(|w| w == quoted.as_bytes()) {
        Reference::Other
    } else {
        Reference::None
    })
}

/// Takes our entry out of every configuration file of the conf dir that
/// has one (not only the runtime's choice: an install with --conf-file may
/// have chained another), then (with a bin dir) removes the binary, unless
/// a file still names it; the reverse order of [`install`].
pub fn uninstall(opts: &Options) -> Result<Vec<String>, InstallError> {
    let _lock = lock_dir(&opts.conf_dir)?;
    let entries = read_conf_dir(&opts.conf_dir)?;
    let mut files: Vec<PathBuf> = conf_files(&entries)
        .into_iter()
        .map(|name| opts.conf_dir.join(name))
        .collect();
    if let Some(name) = &opts.conf_file {
        let named = opts.conf_dir.join(name);
        if !files.contains(&named) {
            files.push(named);
        }
    }
    let mut done = Vec::new();
    for path in &files {
        if reference_in(path)? == Reference::InList {
            done.push(edit_file(path, &unchain, &mut |_| {})?.line());
        }
    }
    if done.is_empty() {
        done.push(format!(
            "{}: no plugin list has an entry of {PLUGIN_TYPE}",
            opts.conf_dir.display()
        ));
    }
    let Some(bin_dir) = &opts.bin_dir else {
        return Ok(done);
    };
    let target = bin_dir.join(PLUGIN_TYPE);
    // Removing the binary while a file names it would fail every ADD and
    // DEL of that network instead of leaving palisade-cni in place.
    for path in &files {
        if reference_in(path)? != Reference::None {
            return Err(InstallError::Config {
                path: path.display().to_string(),
                reason: format!(
                    "still references {PLUGIN_TYPE} outside a plugin list entry uninstall can \
                     remove; {} is kept so the runtime can still run it: remove the \
                     reference, then run uninstall again",
                    target.display()
                ),
            });
        }
    }
    match std::fs::remove_file(&target) {
        Ok(()) => done.push(format!("{}: removed", target.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            done.push(format!("{}: absent", target.display()))
        }
        Err(e) => return Err(io(format!("removing {}", target.display()), e)),
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::super::test_fixtures::{flannel, node, tree, SOCKET};
    use super::*;

    /// Our entry as `node`'s options chain it.
    fn ours() -> Value {
        entry(SOCKET, 10)
    }

    #[test]
    fn chain_appends_once_and_is_idempotent() {
        let (once, changed) = chain(&flannel(), &ours(), "f").unwrap();
        assert!(changed);
        let plugins = once["plugins"].as_array().unwrap();
        assert_eq!(plugins.len(), 3);
        assert_eq!(plugins[2], ours());
        assert_eq!(plugins[..2], flannel()["plugins"].as_array().unwrap()[..]);
        let (twice, changed) = chain(&once, &ours(), "f").unwrap();
        assert!(!changed);
        assert_eq!(twice, once);
    }

    #[test]
    fn chain_replaces_a_stale_or_misplaced_entry_of_ours() {
        let mut conf = flannel();
        let plugins = conf["plugins"].as_array_mut().unwrap();
        plugins.insert(0, entry("/old.sock", 5));
        plugins.push(entry("/old.sock", 5));
        let (new, changed) = chain(&conf, &ours(), "f").unwrap();
        assert!(changed);
        let plugins = new["plugins"].as_array().unwrap();
        assert_eq!(plugins.iter().filter(|p| is_ours(p)).count(), 1);
        assert_eq!(plugins.last().unwrap(), &ours());
        assert_eq!(plugins[0]["type"], "flannel");
    }

    /// The watch's re-chain keeps any single entry of ours that is last
    /// (another pod's options, in a rollout), and fixes the rest.
    #[test]
    fn a_rechain_keeps_any_entry_of_ours_alone_and_last() {
        let (theirs, _) = chain(&flannel(), &entry("/old.sock", 5), "f").unwrap();
        let (same, what) = chain_as(&theirs, &ours(), "f", Keep::AnyOfOurs).unwrap();
        assert_eq!((what, &same), (Chained::Already, &theirs));
        let (_, what) = chain_as(&theirs, &ours(), "f", Keep::OnlyOurs).unwrap();
        assert_eq!(what, Chained::Replaced);
        let (_, what) = chain_as(&flannel(), &ours(), "f", Keep::AnyOfOurs).unwrap();
        assert_eq!(what, Chained::Appended);
        // Not last, or not alone: ours, last.
        let mut not_last = theirs.clone();
        not_last["plugins"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "bandwidth"}));
        let mut twice = theirs.clone();
        twice["plugins"].as_array_mut().unwrap().push(ours());
        for conf in [not_last, twice] {
            let (new, what) = chain_as(&conf, &ours(), "f", Keep::AnyOfOurs).unwrap();
            assert_eq!(what, Chained::Replaced, "{conf}");
            let plugins = new["plugins"].as_array().unwrap();
            assert_eq!(plugins.iter().filter(|p| is_ours(p)).count(), 1, "{new}");
            assert_eq!(plugins.last().unwrap(), &ours(), "{new}");
        }
    }

    #[test]
    fn the_binary_is_compared_by_content() {
        let dir = tempfile::tempdir().unwrap();
        let (own, installed) = (dir.path().join("own"), dir.path().join("installed"));
        // More than one block, differing only in the last byte.
        let mut bytes = vec![7u8; (64 << 10) * 2 + 5];
        std::fs::write(&own, &bytes).unwrap();
        assert!(!same_contents(&own, &installed).unwrap(), "absent");
        std::fs::write(&installed, &bytes).unwrap();
        assert!(same_contents(&own, &installed).unwrap());
        *bytes.last_mut().unwrap() = 8;
        std::fs::write(&installed, &bytes).unwrap();
        assert!(!same_contents(&own, &installed).unwrap());
        std::fs::write(&installed, &bytes[1..]).unwrap();
        assert!(!same_contents(&own, &installed).unwrap());
        let err = same_contents(&dir.path().join("gone"), &installed).unwrap_err();
        assert!(err.to_string().contains("gone"), "{err}");
    }

    #[test]
    fn unchain_removes_only_ours_and_reverses_chain() {
        let (chained, _) = chain(&flannel(), &ours(), "f").unwrap();
        let (back, changed) = unchain(&chained, "f").unwrap();
        assert!(changed);
        assert_eq!(back, flannel());
        let (again, changed) = unchain(&back, "f").unwrap();
        assert!(!changed);
        assert_eq!(again, flannel());
    }

    #[test]
    fn configurations_that_cannot_be_chained_are_named() {
        let single = json!({"cniVersion": "1.0.0", "name": "n", "type": "bridge"});
        let err = chain(&single, &ours(), "/etc/cni/net.d/10-bridge.conf").unwrap_err();
        assert!(err.to_string().contains("10-bridge.conf"), "{err}");
        assert!(err.to_string().contains("single-plugin"), "{err}");
        let only_ours = json!({"cniVersion": "1.0.0", "name": "n", "plugins": [ours()]});
        let err = chain(&only_ours, &ours(), "f").unwrap_err();
        assert!(err.to_string().contains("no interface plugin"), "{err}");
        let not_list = json!({"name": "n", "plugins": {"type": "x"}});
        assert!(chain(&not_list, &ours(), "f").is_err());
        assert!(unchain(&json!([1, 2]), "f").is_err());
    }

    #[test]
    fn chain_refuses_a_list_whose_cni_version_the_plugin_refuses() {
        for version in ["0.3.0", "0.3.1", "0.4.0", "1.0.0"] {
            let mut conf = flannel();
            conf["cniVersion"] = json!(version);
            chain(&conf, &ours(), "f").unwrap_or_else(|e| panic!("{version}: {e}"));
        }
        let path = "/etc/cni/net.d/10-old.conflist";
        for (version, shown) in [
            (json!("0.2.0"), "\"0.2.0\""),
            (json!(""), "\"\""),
            (json!(1), "1"),
        ] {
            let mut conf = flannel();
            conf["cniVersion"] = version;
            let err = chain(&conf, &ours(), path).unwrap_err().to_string();
            assert!(err.starts_with(path), "{err}");
            assert!(err.contains("cniVersion") && err.contains(shown), "{err}");
        }
        let mut conf = flannel();
        conf.as_object_mut().unwrap().remove("cniVersion");
        let err = chain(&conf, &ours(), path).unwrap_err().to_string();
        assert!(err.contains("cniVersion is missing"), "{err}");
    }

    #[test]
    fn install_writes_nothing_into_a_list_of_a_refused_cni_version() {
        let mut conf = flannel();
        conf["cniVersion"] = json!("0.2.0");
        let (dir, opts, own) = node(&conf);
        let before = tree(dir.path());
        let err = install(&opts, &own).unwrap_err().to_string();
        assert!(err.contains("10-flannel.conflist"), "{err}");
        assert!(err.contains("cniVersion \"0.2.0\""), "{err}");
        // Neither the list nor the binary.
        assert_eq!(tree(dir.path()), before);
    }

    #[test]
    fn install_refuses_options_the_plugin_would_refuse() {
        let (dir, opts, own) = node(&flannel());
        let before = tree(dir.path());
        for (opts, flag) in [
            (
                Options {
                    timeout_seconds: 0,
                    ..opts.clone()
                },
                "--timeout-seconds",
            ),
            (
                Options {
                    timeout_seconds: 601,
                    ..opts.clone()
                },
                "--timeout-seconds",
            ),
            (
                Options {
                    enforcer_socket: "run/palisade/cni.sock".into(),
                    ..opts.clone()
                },
                "--enforcer-socket",
            ),
        ] {
            let err = install(&opts, &own).unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
            assert_eq!(tree(dir.path()), before, "{err}");
        }
        // The bounds are the plugin's own.
        for timeout_seconds in [1, config::MAX_TIMEOUT_SECONDS] {
            install(
                &Options {
                    timeout_seconds,
                    ..opts.clone()
                },
                &own,
            )
            .unwrap();
        }
    }

    fn files(v: &[&str]) -> Vec<DirEntry> {
        v.iter()
            .map(|s| DirEntry {
                name: s.to_string(),
                is_dir: false,
            })
            .collect()
    }

    #[test]
    fn the_runtime_uses_the_first_configuration_file() {
        let dir = files(&["99-last.conflist", "10-flannel.conflist", "05-x.txt"]);
        assert_eq!(runtime_choice(&dir).unwrap(), "10-flannel.conflist");
        assert_eq!(runtime_choice(&files(&["README", "a.txt"])), None);
    }

    /// libcni's `ConfFiles` skips no dot-file, and Go sorts '.' (0x2e)
    /// before digits: a dot-file with a conf extension wins.
    #[test]
    fn the_runtime_choice_counts_dot_files() {
        let dir = files(&["10-flannel.conflist", ".10-tmp.conflist"]);
        assert_eq!(runtime_choice(&dir).unwrap(), ".10-tmp.conflist");
    }

    #[test]
    fn the_runtime_choice_takes_the_last_extension_and_byte_order() {
        assert!(is_conf_name(".conf") && is_conf_name("a.json.conf"));
        assert!(!is_conf_name("a.conflist.bak") && !is_conf_name("conflist"));
        assert!(!is_conf_name("a.CONF") && !is_conf_name("a.conf~"));
        // Byte order: upper case before lower, '-' before digits.
        let dir = files(&["b.conf", "B.conf", "1.conf", "-.conf", "a.conflist.bak"]);
        assert_eq!(conf_files(&dir), ["-.conf", "1.conf", "B.conf", "b.conf"]);
    }

    #[test]
    fn the_runtime_choice_skips_directories_but_not_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("00-dir.conflist")).unwrap();
        std::fs::write(dir.path().join("20-real.conflist"), b"{}").unwrap();
        std::os::unix::fs::symlink("20-real.conflist", dir.path().join("10-link.conflist"))
            .unwrap();
        let entries = read_conf_dir(dir.path()).unwrap();
        assert_eq!(
            conf_files(&entries),
            ["10-link.conflist", "20-real.conflist"]
        );
    }

    #[test]
    fn flags_are_checked() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let o = parse_args(&args(&[
            "--conf-dir",
            "/c",
            "--bin-dir",
            "/b",
            "--timeout-seconds",
            "7",
        ]))
        .unwrap();
        assert_eq!(o.conf_dir, PathBuf::from("/c"));
        assert_eq!(o.bin_dir, Some(PathBuf::from("/b")));
        assert_eq!(o.timeout_seconds, 7);
        assert!(!o.watch);
        assert!(parse_args(&args(&["--watch"])).unwrap().watch);
        assert!(parse_args(&args(&["--conf-file", "../x.conflist"])).is_err());
        assert!(parse_args(&args(&["--bogus"]))
            .unwrap_err()
            .to_string()
            .contains("--bogus"));
        assert!(parse_args(&args(&["--conf-dir"])).is_err());
    }

    fn read_json(path: &Path) -> Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    }

    /// The names in `dir` that are none of `expected`.
    fn strays(dir: &Path, expected: &[&str]) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !expected.contains(&n.as_str()))
            .collect()
    }

    #[test]
    fn temporary_files_are_new_files_with_names_of_their_own() {
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("10-flannel.conflist");
        // The name every run in a container used (pid 1): another run's
        // half-written file, which O_TRUNC would have reset and moved.
        let theirs = dir.path().join(format!(
            ".10-flannel.conflist.palisade-{}",
            std::process::id()
        ));
        std::fs::write(&theirs, b"another run's bytes").unwrap();
        replace_atomically(&dest, b"ours", 0o644).unwrap();
        assert_eq!(std::fs::read(&theirs).unwrap(), b"another run's bytes");
        assert_eq!(std::fs::read(&dest).unwrap(), b"ours");

        let (a, _) = create_temp(&dest).unwrap();
        let (b, _) = create_temp(&dest).unwrap();
        assert_ne!(a, b);
        assert!(!is_conf_name(&a.file_name().unwrap().to_string_lossy()));
    }

    #[test]
    fn a_failed_replace_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // rename(2) cannot put a file over a non-empty directory.
        let dest = dir.path().join("10-x.conflist");
        std::fs::create_dir(&dest).unwrap();
        std::fs::write(dest.join("inside"), b"").unwrap();
        let err = replace_atomically(&dest, b"{}", 0o644).unwrap_err();
        assert!(err.to_string().contains("10-x.conflist"), "{err}");
        assert_eq!(strays(dir.path(), &["10-x.conflist"]), Vec::<String>::new());
    }

    #[test]
    fn install_holds_the_conf_dir_lock_from_read_to_rename() {
        let (_dir, opts, own) = node(&flannel());
        let mut tried = 0;
        install_with(&opts, &own, Keep::OnlyOurs, &mut |_| {
            tried += 1;
            let other = File::open(&opts.conf_dir).unwrap();
            // SAFETY: flock on a descriptor this closure owns.
            let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            let e = std::io::Error::last_os_error();
            assert_eq!(rc, -1, "another run could lock the conf dir mid-edit");
            assert_eq!(e.raw_os_error(), Some(libc::EWOULDBLOCK));
        })
        .unwrap();
        assert_eq!(tried, 1);
        // And released after.
        drop(lock_dir(&opts.conf_dir).unwrap());
    }

    #[test]
    fn a_write_by_another_during_the_edit_is_kept_and_the_edit_redone() {
        let (_dir, opts, own) = node(&flannel());
        let mut vendor = flannel();
        vendor["plugins"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "bandwidth"}));
        let mut writes = 0;
        install_with(&opts, &own, Keep::OnlyOurs, &mut |path| {
            if writes == 0 {
                std::fs::write(path, serde_json::to_vec(&vendor).unwrap()).unwrap();
            }
            writes += 1;
        })
        .unwrap();
        assert_eq!(writes, 2, "the edit is redone once");
        let conf = read_json(&opts.conf_dir.join("10-flannel.conflist"));
        let types: Vec<&str> = conf["plugins"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, ["flannel", "portmap", "bandwidth", PLUGIN_TYPE]);
        assert_eq!(
            strays(&opts.conf_dir, &["10-flannel.conflist"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_file_that_keeps_changing_is_refused_by_name_and_left_as_written() {
        let (_dir, opts, own) = node(&flannel());
        let path = opts.conf_dir.join("10-flannel.conflist");
        let mut writes = 0u64;
        let err = install_with(&opts, &own, Keep::OnlyOurs, &mut |path| {
            writes += 1;
            let mut vendor = flannel();
            vendor["name"] = json!(format!("cbr{writes}"));
            // Replaced by rename, as agents do: a new inode each time.
            let tmp = path.with_extension("vendor-tmp");
            std::fs::write(&tmp, serde_json::to_vec(&vendor).unwrap()).unwrap();
            std::fs::rename(&tmp, path).unwrap();
        })
        .unwrap_err()
        .to_string();
        assert_eq!(writes, EDIT_ATTEMPTS as u64);
        assert!(err.starts_with(&path.display().to_string()), "{err}");
        assert!(err.contains("changed by another writer"), "{err}");
        let conf = read_json(&path);
        assert_eq!(conf["name"], format!("cbr{writes}"));
        assert_eq!(conf["plugins"].as_array().unwrap().len(), 2);
        assert_eq!(
            strays(&opts.conf_dir, &["10-flannel.conflist"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_symlinked_list_is_edited_where_it_points_and_stays_a_link() {
        let (dir, opts, own) = node(&flannel());
        let vendor = dir.path().join("vendor");
        std::fs::create_dir(&vendor).unwrap();
        let link = opts.conf_dir.join("10-flannel.conflist");
        std::fs::rename(&link, vendor.join("flannel.conflist")).unwrap();
        std::fs::set_permissions(
            vendor.join("flannel.conflist"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        std::os::unix::fs::symlink("../vendor/flannel.conflist", &link).unwrap();

        let done = install(&opts, &own).unwrap();
        assert!(
            done.last().unwrap().contains("vendor/flannel.conflist"),
            "{done:?}"
        );
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(
            std::fs::read_link(&link).unwrap(),
            Path::new("../vendor/flannel.conflist")
        );
        let target = vendor.join("flannel.conflist");
        assert_eq!(read_json(&target)["plugins"][2], ours());
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o600);
        // The temporary file lived beside the target, and is gone.
        assert_eq!(strays(&vendor, &["flannel.conflist"]), Vec::<String>::new());
        assert_eq!(
            strays(&opts.conf_dir, &["10-flannel.conflist"]),
            Vec::<String>::new()
        );

        uninstall(&opts).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(read_json(&target), flannel());
    }

    #[test]
    fn an_edit_keeps_the_files_mode_and_owner() {
        let (_dir, opts, own) = node(&flannel());
        let path = opts.conf_dir.join("10-flannel.conflist");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        // Only root can give a file away; as anyone else the owner is ours.
        let owner = if unsafe { libc::geteuid() } == 0 {
            std::os::unix::fs::chown(&path, Some(4321), Some(4322)).unwrap();
            (4321, 4322)
        } else {
            let meta = std::fs::metadata(&path).unwrap();
            (meta.uid(), meta.gid())
        };
        install(&opts, &own).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(read_json(&path)["plugins"][2], ours());
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!((meta.uid(), meta.gid()), owner);
    }

    #[test]
    fn uninstall_removes_our_entry_from_every_file() {
        let (_dir, opts, own) = node(&flannel());
        let mut calico = flannel();
        calico["name"] = json!("k8s-pod-network");
        let calico_bytes = serde_json::to_vec_pretty(&calico).unwrap();
        std::fs::write(opts.conf_dir.join("20-calico.conflist"), &calico_bytes).unwrap();
        let plain = br#"{"cniVersion":"1.0.0","name":"p","plugins":[{"type":"ptp"}]}"#;
        std::fs::write(opts.conf_dir.join("30-plain.conflist"), plain).unwrap();
        // libcni lists it, and reading it fails: not a reference.
        std::os::unix::fs::symlink("gone", opts.conf_dir.join("40-dangling.conf")).unwrap();
        install(&opts, &own).unwrap();
        let calico_opts = Options {
            conf_file: Some("20-calico.conflist".into()),
            ..opts.clone()
        };
        install(&calico_opts, &own).unwrap();
        assert_eq!(
            read_json(&opts.conf_dir.join("20-calico.conflist"))["plugins"][2],
            ours()
        );

        let done = uninstall(&opts).unwrap();
        assert_eq!(done.len(), 3, "{done:?}");
        assert_eq!(
            read_json(&opts.conf_dir.join("10-flannel.conflist")),
            flannel()
        );
        assert_eq!(read_json(&opts.conf_dir.join("20-calico.conflist")), calico);
        assert_eq!(
            std::fs::read(opts.conf_dir.join("30-plain.conflist")).unwrap(),
            plain
        );
        assert!(!opts.bin_dir.as_ref().unwrap().join(PLUGIN_TYPE).exists());
    }

    #[test]
    fn uninstall_keeps_the_binary_while_a_file_still_references_it() {
        let (_dir, opts, own) = node(&flannel());
        install(&opts, &own).unwrap();
        let binary = opts.bin_dir.as_ref().unwrap().join(PLUGIN_TYPE);
        for (name, text) in [
            (
                "50-single.conf",
                r#"{"cniVersion":"1.0.0","name":"x","type":"palisade-cni"}"#,
            ),
            (
                "50-delegate.conflist",
                r#"{"cniVersion":"1.0.0","name":"x","plugins":[{"type":"multus","delegates":[{"type":"palisade-cni"}]}]}"#,
            ),
            (
                "50-broken.json",
                r#"{"plugins": [{"type": "palisade-cni"},"#,
            ),
        ] {
            let path = opts.conf_dir.join(name);
            std::fs::write(&path, text).unwrap();
            let err = uninstall(&opts).unwrap_err().to_string();
            assert!(err.starts_with(&path.display().to_string()), "{err}");
            assert!(err.contains("still references"), "{err}");
            assert!(binary.exists(), "{name}");
            // What uninstall can remove, it did; the file it cannot edit is as it was.
            assert_eq!(
                read_json(&opts.conf_dir.join("10-flannel.conflist")),
                flannel()
            );
            assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
            std::fs::remove_file(&path).unwrap();
        }
        uninstall(&opts).unwrap();
        assert!(!binary.exists());
    }

    #[test]
    fn concurrent_installs_publish_whole_files() {
        let (_dir, opts, own) = node(&flannel());
        std::thread::scope(|s| {
            for timeout_seconds in 1..=8 {
                let (opts, own) = (&opts, &own);
                s.spawn(move || {
                    install(
                        &Options {
                            timeout_seconds,
                            ..opts.clone()
                        },
                        own,
                    )
                    .unwrap();
                });
            }
        });
        let conf = read_json(&opts.conf_dir.join("10-flannel.conflist"));
        let plugins = conf["plugins"].as_array().unwrap();
        assert_eq!(plugins.len(), 3, "{conf}");
        assert_eq!(plugins[..2], flannel()["plugins"].as_array().unwrap()[..]);
        assert!(is_ours(&plugins[2]));
        assert_eq!(
            strays(&opts.conf_dir, &["10-flannel.conflist"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn install_then_uninstall_on_disk_restores_the_file() {
        let (_dir, opts, own) = node(&flannel());
        let (conf, bin) = (opts.conf_dir.clone(), opts.bin_dir.clone().unwrap());
        std::fs::write(conf.join("99-other.conflist"), b"{}").unwrap();

        let first = install(&opts, &own).unwrap();
        assert!(first.iter().all(|l| !l.ends_with("unchanged")), "{first:?}");
        let second = install(&opts, &own).unwrap();
        assert!(
            second.iter().all(|l| l.ends_with("unchanged")),
            "{second:?}"
        );
        let chained: Value =
            serde_json::from_slice(&std::fs::read(conf.join("10-flannel.conflist")).unwrap())
                .unwrap();
        assert_eq!(chained["plugins"][2], ours());
        assert_eq!(std::fs::read(bin.join(PLUGIN_TYPE)).unwrap(), b"binary");
        // Only the runtime's file was touched, and no temporary file is left.
        assert_eq!(
            std::fs::read(conf.join("99-other.conflist")).unwrap(),
            b"{}"
        );
        assert_eq!(std::fs::read_dir(&conf).unwrap().count(), 2);

        uninstall(&opts).unwrap();
        let back: Value =
            serde_json::from_slice(&std::fs::read(conf.join("10-flannel.conflist")).unwrap())
                .unwrap();
        assert_eq!(back, flannel());
        assert!(!bin.join(PLUGIN_TYPE).exists());
        assert!(uninstall(&opts).is_ok(), "a second uninstall is a no-op");
    }
}
