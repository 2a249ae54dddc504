//! A real ctxfs mount per test: its own temp dir under /tmp (other uids must
//! reach it), mounted through /dev/fuse by the real binary, unmounted on drop.
//! No test skips: if FUSE is missing, mounting fails and the test fails.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ctxfs");

/// Run the ctxfs binary with `args`.
pub fn ctxfs(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().expect("run ctxfs")
}

pub struct Mount {
    pub dir: tempfile::TempDir,
    pub mnt: PathBuf,
    pub data: PathBuf,
    pub config: Option<PathBuf>,
    /// Extra `ctxfs mount` arguments.
    pub args: Vec<String>,
    /// Environment of `ctxfs mount` (and so of the daemon).
    pub env: Vec<(String, String)>,
    /// A command `ctxfs mount` runs under (e.g. `nsenter --net=…`: the
    /// daemon in another network namespace, as on another host).
    pub prefix: Vec<String>,
    mounted: bool,
}

/// MiniLM's files for the tests (`make model` puts them there).
pub fn model_dir() -> PathBuf {
    std::env::var_os("CTXFS_MODEL_DIR")
        .map(Into::into)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2"))
}

/// `program` run as `uid` (0 = root: as it is), for arguments that must
/// not pass through a shell.
pub fn command_as(uid: u32, program: &str) -> Command {
    if uid == 0 {
        return Command::new(program);
    }
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={uid}"),
        &format!("--regid={uid}"),
        "--clear-groups",
        program,
    ]);
    c
}

/// A config with acme (writer 1001, reader 1002) and other (writer 1003).
pub const CONFIG: &str = r#"
[[account]]
id = "acme"
writers = [1001]
readers = [1002]

[[account]]
id = "other"
writers = [1003]
"#;

pub const WRITER: u32 = 1001;
pub const READER: u32 = 1002;
pub const STRANGER: u32 = 1003;
/// A uid listed in no account.
pub const NOBODY: u32 = 3101;

impl Mount {
    pub fn new() -> Mount {
        Self::with_config(None)
    }

    pub fn with_config(config: Option<&str>) -> Mount {
        Self::with_args(config, &[])
    }

    /// A mount whose events stay in the outbox (no indexer).
    pub fn without_index() -> Mount {
        Self::with_args(None, &["--no-index"])
    }

    pub fn with_args(config: Option<&str>, args: &[&str]) -> Mount {
        Self::with_env(config, args, &[])
    }

    pub fn with_env(config: Option<&str>, args: &[&str], env: &[(&str, &str)]) -> Mount {
        Self::with_prefix(config, args, env, &[])
    }

    pub fn with_prefix(
        config: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
        prefix: &[&str],
    ) -> Mount {
        let mut m = Self::prepared(config, args, env, prefix);
        m.mount();
        m
    }

    /// A mount made ready but not mounted: the test prepares its data dir
    /// (a small file system, damaged files) and calls [`Mount::mount`].
    pub fn prepared(
        config: Option<&str>,
        args: &[&str],
        env: &[(&str, &str)],
        prefix: &[&str],
    ) -> Mount {
        let dir = tempfile::Builder::new()
            .prefix("ctxfs-test-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        chmod(dir.path(), 0o755);
        let mnt = dir.path().join("mnt");
        let data = dir.path().join("data");
        std::fs::create_dir(&mnt).unwrap();
        chmod(&mnt, 0o755);
        let config = config.map(|c| {
            let p = dir.path().join("config.toml");
            std::fs::write(&p, c).unwrap();
            p
        });
        Mount {
            dir,
            mnt,
            data,
            config,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            prefix: prefix.iter().map(|a| a.to_string()).collect(),
            mounted: false,
        }
    }

    pub fn mount(&mut self) {
        let out = self.try_mount();
        assert!(
            out.status.success(),
            "ctxfs mount failed (is FUSE available? /dev/fuse and fusermount3 are required): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ctxfs mount` with this mount's data dir, config and arguments, as
    /// it answers (a test that expects a refusal reads its stderr).
    pub fn try_mount(&mut self) -> Output {
        let mut cmd = match self.prefix.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.arg("mount")
            .arg(&self.mnt)
            .arg("--data")
            .arg(&self.data);
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        cmd.args(&self.args);
        cmd.envs(self.env.iter().map(|(k, v)| (k, v)));
        let out = cmd.output().expect("run ctxfs mount");
        self.mounted = out.status.success();
        out
    }

    pub fn umount(&mut self) {
        let out = ctxfs(&["umount", self.mnt.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "umount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.mounted = false;
    }

    pub fn daemon_pid(&self) -> i32 {
        std::fs::read_to_string(self.mnt.join(".ctxfs/pid"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// SIGKILL the daemon and wait until its mount is gone (auto-unmount).
    pub fn kill9(&mut self) {
        let pid = self.daemon_pid();
        unsafe { libc::kill(pid, libc::SIGKILL) };
        self.wait_gone(pid);
    }

    /// Wait (with a deadline) until daemon `pid` has exited (a zombie not yet
    /// reaped counts as exited) and its mount is gone or dead (`ENOTCONN`:
    /// the next `ctxfs mount` detaches a dead mount itself).
    pub fn wait_gone(&mut self, pid: i32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let alive = alive(pid);
            let dead = std::fs::metadata(&self.mnt)
                .err()
                .and_then(|e| e.raw_os_error())
                == Some(libc::ENOTCONN);
            let mount_live = is_mounted(&self.mnt) && !dead;
            if !alive && !mount_live {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "daemon {pid}: alive {alive}, mount still live {mount_live}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self.mounted = false;
    }

    /// A file outside the mount that every uid may write.
    pub fn shared_file(&self, name: &str) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::write(&p, "").unwrap();
        chmod(&p, 0o666);
        p
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }

    /// `/bin/sh -c script` as `uid` (0 = root), with `$M` set to the
    /// mountpoint, in /tmp.
    fn sh_cmd(&self, uid: u32, script: &str) -> Command {
        let mut cmd = command_as(uid, "/bin/sh");
        cmd.arg("-c")
            .arg(script)
            .env("M", &self.mnt)
            .env("HOME", "/tmp")
            .current_dir("/tmp");
        cmd
    }

    /// Run a shell script as `uid` (0 = root) with `$M` set to the mountpoint.
    pub fn sh(&self, uid: u32, script: &str) -> Output {
        self.sh_cmd(uid, script)
            .stdin(Stdio::null())
            .output()
            .expect("run sh")
    }

    /// Start a shell script as `uid` in the background.
    pub fn spawn_as(&self, uid: u32, script: &str) -> std::process::Child {
        self.sh_cmd(uid, script).spawn().expect("spawn as uid")
    }

    /// Start a shell script as `uid` in the background, its output captured
    /// (`wait_with_output`).
    pub fn spawn_piped(&self, uid: u32, script: &str) -> std::process::Child {
        self.sh_cmd(uid, script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn as uid")
    }

    /// Run and require success; returns stdout.
    pub fn ok(&self, uid: u32, script: &str) -> String {
        let o = self.sh(uid, script);
        assert!(
            o.status.success(),
            "as uid {uid}: `{script}` failed ({:?}):\nstdout: {}\nstderr: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Run and require failure whose stderr mentions `msg` (an strerror text).
    pub fn fails(&self, uid: u32, script: &str, msg: &str) {
        let o = self.sh(uid, script);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && err.contains(msg),
            "as uid {uid}: `{script}` should fail with {msg:?}; status {:?}, stderr: {err}, stdout: {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout)
        );
    }

    /// Run and require success; stdout parsed as JSON.
    pub fn json(&self, uid: u32, script: &str) -> serde_json::Value {
        let out = self.ok(uid, script);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("`{script}`: not JSON ({e}): {out}"))
    }

    /// Unmount, then require a clean `ctxfs fsck` of the data dir.
    pub fn umount_and_fsck(mut self) {
        self.umount();
        self.fsck();
    }

    pub fn fsck(&self) -> String {
        let out = ctxfs(&["fsck", "--data", self.data.to_str().unwrap()]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "fsck found violations:\n{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new(BIN).arg("umount").arg(&self.mnt).output();
            if is_mounted(&self.mnt) {
                let _ = Command::new("umount").arg("-l").arg(&self.mnt).output();
            }
        }
    }
}

/// Is process `pid` running (not exited, not a zombie awaiting its reaper)?
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the ")" that closes the command name.
        Ok(stat) => stat
            .rsplit_once(") ")
            .map(|(_, r)| !r.starts_with('Z'))
            .unwrap_or(false),
        Err(_) => false,
    }
}

pub fn is_mounted(p: &Path) -> bool {
    let s = p.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mounts")
        .map(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(s.as_str())))
        .unwrap_or(false)
}

pub fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// The four-step write of seed 000 as a shell script (`/bin/echo` for the
/// commit so a refused commit fails the script).
pub fn four_steps(node: &str, content: &str, meta: &str) -> String {
    format!(
        "set -e; N=\"$M/accounts/{node}\"; mkdir -p \"$N\"; printf '%s' '{content}' > \"$N/content.md\"; \
         echo '[]' > \"$N/.relations.json\"; echo 'abstract of {node}' > \"$N/.abstract.md\"; \
         echo '# overview' > \"$N/.overview.md\"; /bin/echo '{meta}' > \"$N/.meta.json\""
    )
}

pub const ACTIVE: &str = r#"{"status":"ACTIVE"}"#;

/// A fresh database on the test PostgreSQL (PostgreSQL 18 + pgvector from
/// PyPI, `scripts/pg-setup.sh`, started here if it is not running), dropped
/// at the end of the test.
pub struct PgDb {
    pub url: String,
    name: String,
    /// Tests that restart the server hold it alone.
    _turn: PgTurn,
}

enum PgTurn {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

static PG_TURN: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// `scripts/pg-setup.sh ARGS` under a lock (tests run in parallel); `-o`:
/// the server it starts must not inherit the lock.
fn pg_setup(args: &[&str]) -> String {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-setup.sh");
    let out = Command::new("flock")
        .args(["-o", "/tmp/ctxfs-pg-setup.lock"])
        .arg(script)
        .args(args)
        .output()
        .expect("run scripts/pg-setup.sh");
    assert!(
        out.status.success(),
        "scripts/pg-setup.sh {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl PgDb {
    pub fn new() -> PgDb {
        let turn = PgTurn::Shared(PG_TURN.read().unwrap_or_else(|e| e.into_inner()));
        Self::with_turn(turn)
    }

    /// A database for a test that restarts the server: no other test uses
    /// the server meanwhile.
    pub fn alone() -> PgDb {
        let turn = PgTurn::Alone(PG_TURN.write().unwrap_or_else(|e| e.into_inner()));
        Self::with_turn(turn)
    }

    fn with_turn(turn: PgTurn) -> PgDb {
        static STARTED: std::sync::Once = std::sync::Once::new();
        STARTED.call_once(|| {
            pg_setup(&["start"]);
        });
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "ctxfs_t{}_{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        );
        let url = pg_setup(&["createdb", &name]);
        PgDb {
            url,
            name,
            _turn: turn,
        }
    }

    /// A daemon of this database: `Mount` with `--store URL` and its own data dir.
    pub fn mount(&self, config: Option<&str>, args: &[&str]) -> Mount {
        let mut a = vec!["--store", self.url.as_str()];
        a.extend_from_slice(args);
        Mount::with_args(config, &a)
    }

    /// Run `sql` on this database; what it printed (unaligned, tuples only).
    pub fn sql(&self, sql: &str) -> String {
        pg_setup(&["sql", &self.name, sql])
    }

    /// `pg_dump` of this database.
    pub fn dump(&self) -> String {
        pg_setup(&["dump", &self.name])
    }

    /// The server's data directory.
    pub fn datadir(&self) -> String {
        pg_setup(&["datadir"])
    }

    /// Stop and start the server (the database survives).
    pub fn restart_server(&self) {
        pg_setup(&["restart"]);
    }
}

impl Drop for PgDb {
    fn drop(&mut self) {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/pg-setup.sh");
        let _ = Command::new("flock")
            .args(["-o", "/tmp/ctxfs-pg-setup.lock"])
            .arg(script)
            .args(["dropdb", &self.name])
            .output();
    }
}

/// Poll `check` until it holds or `limit` passes; how long it took.
pub fn within(limit: Duration, mut check: impl FnMut() -> bool) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() <= limit {
        if check() {
            return Some(t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// A transcript in docs/AGENTS.md between `<!-- NAME:begin -->` and
/// `<!-- NAME:end -->` is exactly `got` (what a real session printed);
/// with `CTXFS_UPDATE_DOCS` set (`make agents-doc`), the block is rewritten.
pub fn agents_doc_block(name: &str, got: &str) {
    let doc_path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/AGENTS.md");
    let doc = std::fs::read_to_string(doc_path).unwrap();
    let begin = format!("<!-- {name}:begin -->\n```text\n");
    let end = format!("```\n<!-- {name}:end -->");
    let (b, e) = (
        doc.find(&begin).expect("transcript start marker") + begin.len(),
        doc.find(&end).expect("transcript end marker"),
    );
    if std::env::var_os("CTXFS_UPDATE_DOCS").is_some() {
        std::fs::write(doc_path, format!("{}{got}{}", &doc[..b], &doc[e..])).unwrap();
        return;
    }
    assert_eq!(
        &doc[b..e],
        got,
        "docs/AGENTS.md's {name} block differs from a real session (`make agents-doc` updates it)"
    );
}
