//! Process lifecycle: start in the background with a readiness pipe, hold
//! the data dir lock, serve until unmounted or signalled, then make every
//! draft durable and close the store.

mod log;

pub use self::log::{log_writer, LOG_MAX_ENV};
use crate::config::Settings;
use crate::core::Fs;
use crate::data::{lock_data_dir, open_index, settings, LOG_FILE};
use crate::store::Store;
use anyhow::{anyhow, bail, Context, Result};
use std::fs::{File, OpenOptions};
use std::io::{BufRead, Write};
use std::os::fd::FromRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const READY_FD: &str = "CTXFS_READY_FD";

pub struct MountOpts {
    pub mountpoint: PathBuf,
    pub data: PathBuf,
    pub config: Option<PathBuf>,
    pub threads: usize,
    pub repair_grace: Duration,
    pub sweep_interval: Duration,
    /// Overrides of the config's `[index] embedder` and `model_dir`.
    pub embedder: Option<String>,
    pub model_dir: Option<PathBuf>,
    /// Run no indexer (also `[index] enabled = false`).
    pub no_index: bool,
    /// Serve the metrics over HTTP here.
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// Uncommitted bytes held in memory at most.
    pub draft_memory: u64,
    /// A shared PostgreSQL store (`postgres://…`) instead of the data dir's redb.
    pub store: Option<String>,
    /// Mount each uid's read-only view under this directory (`DIR/UID`).
    pub views: Option<PathBuf>,
}

/// Files and directories this process creates are its owner's alone
/// (`0600`/`0700`), whatever the umask it was started with.
pub fn owner_only_umask() {
    // SAFETY: umask(2) only sets the process's file mode creation mask.
    unsafe { libc::umask(0o077) };
}

/// Checks that need no daemon: fail early with a one-line reason.
/// What a mount needs before it touches the data dir: the settings, and
/// the master key read and checked (`[encryption]`), so a bad config or key
/// leaves no data dir behind.
fn precheck(o: &MountOpts) -> Result<(Settings, Option<crate::store::seal::MasterKey>)> {
    let md = match std::fs::metadata(&o.mountpoint) {
        // A FUSE mount whose daemon died (e.g. kill -9): detach it first.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            unmount(&o.mountpoint, true)
                .map_err(|e| anyhow!("stale mount at {}: {e}", o.mountpoint.display()))?;
            tracing::warn!(mountpoint = %o.mountpoint.display(), "detached a stale mount");
            std::fs::metadata(&o.mountpoint)
        }
        r => r,
    }
    .map_err(|e| anyhow!("mountpoint {} is not usable: {e}", o.mountpoint.display()))?;
    if !md.is_dir() {
        bail!("mountpoint {} is not a directory", o.mountpoint.display());
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: FUSE is not available on this machine (install fuse3)");
    }
    let s = settings(
        o.config.as_deref(),
        o.embedder.as_ref(),
        o.model_dir.as_ref(),
    )?;
    let master = crate::data::read_key(crate::data::key_source(Some(&s))?.as_ref())?;
    crate::data::private_dir(&o.data)?;
    Ok((s, master))
}

/// `ctxfs mount` without `--foreground`: run the daemon as a child and return
/// once it says the mount is ready (or why it is not).
pub fn start_background(o: MountOpts) -> Result<i32> {
    // The daemon reads the key again (a key command runs twice).
    let (settings, _) = precheck(&o)?;
    let mut fds = [0; 2];
    // SAFETY: `fds` is a writable array of two ints, as pipe(2) requires.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (rfd, wfd) = (fds[0], fds[1]);
    // SAFETY: `rfd` is the pipe end just opened and owned here; F_SETFD takes an int.
    unsafe { libc::fcntl(rfd, libc::F_SETFD, libc::FD_CLOEXEC) };
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(o.data.join(LOG_FILE))
        .with_context(|| format!("cannot open log in {}", o.data.display()))?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.arg("mount")
        .arg(&o.mountpoint)
        .arg("--foreground")
        .arg("--data")
        .arg(&o.data)
        .arg("--threads")
        .arg(o.threads.to_string())
        .arg("--repair-grace")
        .arg(o.repair_grace.as_secs().to_string())
        .arg("--sweep-interval")
        .arg(o.sweep_interval.as_secs().to_string());
    if let Some(c) = &o.config {
        cmd.arg("--config").arg(c);
    }
    if let Some(e) = &o.embedder {
        cmd.arg("--embedder").arg(e);
    }
    if let Some(d) = &o.model_dir {
        cmd.arg("--model-dir").arg(d);
    }
    if o.no_index {
        cmd.arg("--no-index");
    }
    cmd.arg("--draft-memory-mb")
        .arg((o.draft_memory >> 20).to_string());
    if let Some(u) = &o.store {
        cmd.arg("--store").arg(u);
    }
    if let Some(a) = &o.metrics_addr {
        cmd.arg("--metrics-addr").arg(a.to_string());
    }
    if let Some(v) = &o.views {
        cmd.arg("--views").arg(v);
    }
    cmd.env(READY_FD, wfd.to_string())
        .env(log::LOG_ENV, o.data.join(LOG_FILE))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(log);
    // SAFETY: the closure runs in the forked child before exec and calls only
    // setsid(2), which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let child = cmd.spawn().context("cannot start the daemon")?;
    // SAFETY: `wfd` is our copy of the pipe's write end; the child has its own.
    unsafe { libc::close(wfd) };
    let mut answer = String::new();
    // SAFETY: `rfd` is an open pipe end owned by nothing else; the File takes it over.
    let r = unsafe { File::from_raw_fd(rfd) };
    let _ = std::io::BufReader::new(r).read_line(&mut answer);
    match answer.trim() {
        "ok" => {
            println!(
                "ctxfs mounted at {} (pid {}, data {})",
                o.mountpoint.display(),
                child.id(),
                o.data.display()
            );
            // Once mounted: a refusal stays a one-line reason.
            warn_if_no_model(&o, &settings);
            warn_if_llm_silent(&settings);
            Ok(0)
        }
        "" => bail!(
            "the daemon exited before the mount was ready; see {}",
            o.data.join(LOG_FILE).display()
        ),
        msg => bail!("{}", msg.trim_start_matches("err: ")),
    }
}

struct Ready(Option<File>);

impl Ready {
    fn from_env() -> Ready {
        let fd = std::env::var(READY_FD)
            .ok()
            .and_then(|v| v.parse::<i32>().ok());
        std::env::remove_var(READY_FD);
        // Helpers we spawn (fusermount3 stays alive for auto-unmount) must not
        // inherit the pipe, or the parent never sees it close.
        if let Some(fd) = fd {
            // SAFETY: `fd` is the readiness pipe our parent passed down; F_SETFD takes an int.
            unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
        }
        // SAFETY: the readiness fd is open, inherited for this purpose only, and owned
        // by nothing else in this process; the File takes it over.
        Ready(fd.map(|fd| unsafe { File::from_raw_fd(fd) }))
    }
    fn say(&mut self, msg: &str) {
        if let Some(mut f) = self.0.take() {
            let _ = writeln!(f, "{msg}");
        }
    }
}

/// Say on stderr, at mount, when search will run without its model.
fn warn_if_no_model(o: &MountOpts, s: &Settings) {
    if o.no_index || s.index.enabled == Some(false) {
        return;
    }
    if let Some(note) = crate::index::missing_model_note(&s.index, &o.data) {
        eprintln!("ctxfs: warning: {note}");
    }
}

/// Say on stderr, at mount, when the configured LLM does not answer:
/// conversations are still taken, and wait for it.
fn warn_if_llm_silent(s: &Settings) {
    if let Some(l) = &s.llm {
        if let Err(e) = crate::extract::llm::probe(&l.url) {
            eprintln!(
                "ctxfs: warning: the LLM of [llm] does not answer ({e}); conversations written to an inbox wait and are retried"
            );
        }
    }
}

pub fn run_foreground(o: MountOpts) -> Result<i32> {
    let mut ready = Ready::from_env();
    let result = serve(&o, &mut ready);
    if let Err(e) = &result {
        ready.say(&format!("err: {e:#}"));
    }
    result
}

fn serve(o: &MountOpts, ready: &mut Ready) -> Result<i32> {
    let (settings, master) = precheck(o)?;
    let _lock = lock_data_dir(&o.data)?;
    let (store, close_store) = open_store(o, &settings, master)?;
    let fs = Fs::new(store.clone(), settings.tenancy.clone())?;
    if store.shared() {
        // Other daemons' commits: drop what this one and its kernel cache hold.
        let weak = Arc::downgrade(&fs);
        store.clone().watch(Box::new(move |changes| {
            if let Some(fs) = weak.upgrade() {
                fs.remote_changes(changes);
            }
        }))?;
    }
    fs.set_redaction(settings.redaction.clone());
    fs.set_unindexed(settings.unindexed.clone());
    fs.set_quotas(settings.quotas.clone());
    fs.set_draft_memory_limit(o.draft_memory);
    let inbox = match &settings.llm {
        Some(l) => {
            let ib = Arc::new(crate::core::inbox::Inbox::new(l, settings.review.clone())?);
            fs.set_inbox(ib.clone());
            Some(ib)
        }
        None => None,
    };
    let t = Instant::now();
    let actions = fs
        .repair(o.repair_grace)
        .map_err(|e| anyhow!("repair: {e}"))?;
    tracing::info!(
        actions = actions.len(),
        ms = t.elapsed().as_millis() as u64,
        "repair job at mount"
    );

    let index = if o.no_index || settings.index.enabled == Some(false) {
        tracing::info!("search disabled: no indexer runs");
        None
    } else {
        let index = open_index(&store, &o.data, &settings)?;
        index.start()?;
        fs.set_index(index.clone());
        Some(index)
    };

    if let Some(addr) = o.metrics_addr {
        serve_metrics(addr, fs.clone())?;
    }

    let stop = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;

    let views = view_places(o, &settings.tenancy)?;
    if let Some(dir) = &o.views {
        fs.set_views(dir.clone());
    }
    let (session, views) = crate::fuse::spawn(fs.clone(), &o.mountpoint, o.threads, &views)
        .map_err(|e| anyhow!("cannot mount at {}: {e}", o.mountpoint.display()))?;
    tracing::info!(mountpoint = %o.mountpoint.display(), data = %o.data.display(), views = views.len(), "mounted");
    // Run by hand in the foreground (no parent to tell): warn here, mounted.
    if ready.0.is_none() {
        warn_if_no_model(o, &settings);
        warn_if_llm_silent(&settings);
    }
    ready.say("ok");

    // Its own flag: the sweeper must end (and drop its reference to the
    // store) however the session ends, or redb is not closed cleanly and
    // the next open has to repair the whole file.
    let sweeper_done = Arc::new(AtomicBool::new(false));
    let sweeper = spawn_sweeper(fs.clone(), o.sweep_interval, sweeper_done.clone())?;
    fs.start_inbox()?;

    let mut unmounting = false;
    while !session.guard.is_finished() {
        if stop.load(Ordering::Relaxed) && !unmounting {
            unmounting = true;
            tracing::info!("signal received, unmounting");
            if let Err(e) = unmount(&o.mountpoint, true) {
                tracing::error!(error = %e, "unmount failed");
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let served = session.join();
    // The views go with the main mount.
    for v in views {
        v.unmount();
    }
    sweeper_done.store(true, Ordering::Relaxed);
    let _ = sweeper.join();
    if let Some(ib) = &inbox {
        ib.shutdown();
    }
    let drafts = fs
        .persist_all_drafts()
        .map_err(|e| anyhow!("saving drafts: {e}"))?;
    if let Some(ix) = &index {
        ix.shutdown();
    }
    close_store();
    tracing::info!(drafts, "unmounted; drafts saved, store closed");
    if let Err(e) = served {
        tracing::warn!(error = %e, "session ended with an error");
    }
    Ok(0)
}

/// Where each uid's view goes (`--views DIR`): `DIR/UID` for every uid the
/// config names, or the mounting uid's alone without a config. Views are
/// mounted for another uid, which only root may do.
fn view_places(o: &MountOpts, t: &crate::config::Tenancy) -> Result<Vec<(PathBuf, u32)>> {
    let Some(dir) = &o.views else {
        return Ok(Vec::new());
    };
    // SAFETY: geteuid(2) cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("--views mounts a view for each uid, which needs root");
    }
    if dir.starts_with(&o.mountpoint) {
        bail!(
            "--views {}: the views cannot be inside the mount",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot make the views directory {}", dir.display()))?;
    // Every uid may find its own view's name.
    std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    Ok(t.uids()
        .into_iter()
        .map(|u| (dir.join(u.to_string()), u))
        .collect())
}

/// Closes the store at unmount.
type Closer = Box<dyn Fn()>;

/// The store the options name: PostgreSQL for `--store URL` (or `[store]
/// url`), else the embedded redb file of the data dir; and how to close it.
fn open_store(
    o: &MountOpts,
    s: &Settings,
    master: Option<crate::store::seal::MasterKey>,
) -> Result<(Arc<dyn Store>, Closer)> {
    match o.store.clone().or_else(|| s.store_url.clone()) {
        Some(url) => {
            let pg = crate::store::PgStore::open(&url, &o.data)
                .map_err(|e| anyhow!("{}", e.report()))?;
            pg.agree_settings(&s.shared_sections())
                .map_err(|e| anyhow!("{}", e.report()))?;
            tracing::info!(url = %pg.url(), "serving a shared PostgreSQL store");
            let closer = pg.clone();
            let store = crate::data::seal_with(pg, master)?;
            Ok((store, Box::new(move || closer.close())))
        }
        None => {
            let redb = crate::data::open_redb(&o.data)?;
            let closer = redb.clone();
            let store = crate::data::seal_with(redb, master)?;
            Ok((store, Box::new(move || closer.close())))
        }
    }
}

/// The TTL sweeper: deletes expired nodes every `every` (they are already
/// invisible; this frees their space and tells the indexer). On a shared
/// store only the daemon that leads "sweeper" sweeps; every daemon hides
/// expired nodes at once all the same.
fn spawn_sweeper(
    fs: Arc<Fs>,
    every: Duration,
    stop: Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>> {
    Ok(std::thread::Builder::new()
        .name("ctxfs-ttl".into())
        .spawn(move || {
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(100));
                if last.elapsed() < every {
                    continue;
                }
                last = Instant::now();
                if let Err(e) = fs.maintain_store() {
                    tracing::warn!(error = %e.report(), "store upkeep failed");
                }
                if !fs.leads("sweeper") {
                    continue;
                }
                match fs.sweep_expired() {
                    Ok(swept) if !swept.is_empty() => {
                        tracing::info!(nodes = swept.len(), "TTL sweep")
                    }
                    Ok(_) => {}
                    Err(e) => tracing::error!(error = %e.report(), "TTL sweep failed"),
                }
            }
        })?)
}

/// The HTTP metrics endpoint on its own thread (`GET /metrics`). Binding
/// happens here, before the mount, so a bad address fails the mount.
fn serve_metrics(addr: std::net::SocketAddr, fs: Arc<Fs>) -> Result<()> {
    let server = tiny_http::Server::http(addr)
        .map_err(|e| anyhow!("cannot serve metrics at {addr}: {e}"))?;
    tracing::info!(%addr, "metrics over HTTP");
    // A weak reference: this thread never ends on its own, and must not keep
    // the store open past the unmount (redb closes cleanly on drop).
    let fs = Arc::downgrade(&fs);
    std::thread::Builder::new()
        .name("ctxfs-metrics".into())
        .spawn(move || {
            for req in server.incoming_requests() {
                let path = req.url().split('?').next().unwrap_or("");
                let r = if path == "/metrics" && *req.method() == tiny_http::Method::Get {
                    let text = match fs.upgrade() {
                        Some(fs) => fs.metrics_text(None),
                        None => Err(crate::error::Error::Unavailable("unmounting".into())),
                    };
                    match text {
                        Ok(text) => tiny_http::Response::from_string(text).with_header(
                            tiny_http::Header::from_bytes(
                                &b"Content-Type"[..],
                                &b"text/plain; version=0.0.4; charset=utf-8"[..],
                            )
                            .expect("valid header"),
                        ),
                        Err(e) => {
                            tiny_http::Response::from_string(format!("{e}\n")).with_status_code(500)
                        }
                    }
                } else {
                    tiny_http::Response::from_string("only GET /metrics is served\n")
                        .with_status_code(404)
                };
                if let Err(e) = req.respond(r) {
                    tracing::debug!(error = %e, "metrics reply failed");
                }
            }
        })?;
    Ok(())
}

/// Unmount. While a process uses the mount, `lazy` detaches it anyway;
/// otherwise the unmount is refused, as umount(8) does.
fn unmount(mp: &Path, lazy: bool) -> Result<()> {
    let busy = || {
        anyhow!(
            "{} is busy: a process has a file open or its working directory inside; \
             close them, or use --lazy",
            mp.display()
        )
    };
    let c = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes())?;
    // SAFETY: `c` is a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return Ok(());
    }
    let err = std::io::Error::last_os_error();
    match err.raw_os_error() {
        Some(libc::EBUSY) if !lazy => return Err(busy()),
        Some(libc::EBUSY) => {
            tracing::warn!("mount busy; detaching lazily");
            // SAFETY: as above, `c` is a NUL-terminated path that outlives the call.
            if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
                return Ok(());
            }
        }
        Some(libc::EPERM) => {}
        _ => bail!("cannot unmount {}: {err}", mp.display()),
    }
    // Not root: the setuid helper.
    let mut cmd = std::process::Command::new("fusermount3");
    cmd.arg("-u");
    if lazy {
        cmd.arg("-z");
    }
    let out = cmd.arg(mp).output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if out.status.success() {
        Ok(())
    } else if !lazy && stderr.contains("busy") {
        Err(busy())
    } else {
        bail!("cannot unmount {}: {}", mp.display(), stderr.trim())
    }
}

/// Whether daemon `pid` has exited. A zombie has: it is the daemon's
/// parent (init, once `ctxfs mount` returned) that reaps it, and some
/// inits reap only every second or two.
fn exited(pid: i32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } != 0 {
        return true;
    }
    // The state is the field after the command name, which ends at the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        // Reaped between the two looks.
        Err(e) => e.kind() == std::io::ErrorKind::NotFound,
    }
}

/// `ctxfs umount`: unmount like umount(8) (refused while busy), then wait
/// for the daemon to save its drafts and exit. With `lazy`, detach now and
/// let the daemon finish when the last process leaves the mount.
pub fn umount(mp: &Path, timeout: u64, lazy: bool) -> Result<i32> {
    let pid_file = mp.join(".ctxfs/pid");
    let pid: i32 = match std::fs::read_to_string(&pid_file) {
        Ok(s) => s.trim().parse().context("unreadable daemon pid")?,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            unmount(mp, true)?;
            println!(
                "{}: the daemon was gone; stale mount detached",
                mp.display()
            );
            return Ok(0);
        }
        Err(e) => bail!("{} is not a ctxfs mount ({e})", mp.display()),
    };
    if lazy {
        // The daemon detaches the mount and exits once nobody uses it.
        // SAFETY: kill(2) takes plain integers and touches no memory of ours.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!(
                "cannot signal daemon {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
        println!(
            "{} detached; daemon {pid} saves its drafts and exits when the last process leaves",
            mp.display()
        );
        return Ok(0);
    }
    unmount(mp, false)?;
    let deadline = Instant::now() + Duration::from_secs(timeout);
    while !exited(pid) {
        if Instant::now() > deadline {
            bail!(
                "{} is unmounted but daemon {pid} did not exit within {timeout}s",
                mp.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("{} unmounted", mp.display());
    Ok(0)
}
