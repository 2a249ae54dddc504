//! The command line (clap only here).

use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(name = "ctxfs", version, about = "AI-agent memory as a FUSE filesystem", long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Mount ctxfs at MOUNTPOINT. Returns once the mount is ready; the daemon stays in the background.
    Mount {
        /// An existing, empty directory.
        mountpoint: PathBuf,
        /// Data directory (redb file, lock, log). Default: $XDG_DATA_HOME/ctxfs or ~/.local/share/ctxfs.
        #[arg(long)]
        data: Option<PathBuf>,
        /// TOML file listing accounts and the uids that may write or read them.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Stay in the foreground (logs on stderr) instead of detaching.
        #[arg(long)]
        foreground: bool,
        /// FUSE worker threads (commits wait for their fsync on a worker).
        #[arg(long, default_value_t = 16)]
        threads: usize,
        /// The mount-time Repair Job leaves drafts touched within this many seconds to their writer.
        #[arg(long, default_value_t = 600)]
        repair_grace: u64,
        /// How often the TTL sweeper deletes expired nodes (they are invisible from the instant they expire).
        #[arg(long, default_value_t = 30)]
        sweep_interval: u64,
        /// Embedder: auto (MiniLM if its files are there, else hashing), minilm, hash, http.
        #[arg(long)]
        embedder: Option<String>,
        /// Directory holding MiniLM's files. Default: DATA/models/all-MiniLM-L6-v2.
        #[arg(long)]
        model_dir: Option<PathBuf>,
        /// Serve the tree without search: no indexer runs, events wait in the outbox.
        #[arg(long)]
        no_index: bool,
        /// Also serve MOUNT/.ctxfs/metrics over HTTP at this address (e.g. 127.0.0.1:9464), path /metrics.
        #[arg(long)]
        metrics_addr: Option<std::net::SocketAddr>,
        /// Uncommitted bytes (drafts, open scratchpad files) the daemon holds in memory at most; writes past it fail with ENOSPC.
        #[arg(long, default_value_t = 1024)]
        draft_memory_mb: u64,
        /// Serve the namespace held in this PostgreSQL database (with
        /// pgvector) instead of the data dir's embedded store:
        /// postgres://USER[:PASSWORD]@HOST:PORT/DB (password also from
        /// PGPASSWORD). Any number of daemons may serve one database.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// Also mount a read-only view for each uid the config names (the
        /// mounting uid without one) at DIR/UID: committed memory only,
        /// entered by that uid alone, cached by the kernel (needs root).
        #[arg(long, value_name = "DIR")]
        views: Option<PathBuf>,
    },
    /// Rebuild the search indexes of an unmounted data dir from its committed nodes.
    Reindex {
        #[arg(long, required_unless_present = "store")]
        data: Option<PathBuf>,
        /// A PostgreSQL store (postgres://…) in place of the data dir's.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long)]
        embedder: Option<String>,
        #[arg(long)]
        model_dir: Option<PathBuf>,
    },
    /// Benchmark the ANN graph against exact search (recall@10, queries/s).
    #[command(hide = true)]
    BenchAnn(BenchAnnOpts),
    /// Search a mounted ctxfs: QUERY among the nodes under DIR (a directory inside an account).
    Search {
        /// What to look for.
        query: String,
        /// Directory inside the mount to search under.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Number of results (default 10).
        #[arg(short, long)]
        k: Option<usize>,
        /// JSON instead of tab-separated lines.
        #[arg(long)]
        json: bool,
        /// hybrid (default), vector or lexical.
        #[arg(long)]
        mode: Option<String>,
        /// Pack the results into at most this many tokens, summary first
        /// (128 to 1,000,000).
        #[arg(long)]
        budget: Option<usize>,
    },
    /// Commit every node under DIR (a directory of a mounted account) that changed since a time as it was then, in one transaction; prints a JSON line per node.
    Restore {
        /// The time: RFC 3339 with its offset (2026-11-20T10:00:00Z) or a day (2026-11-20, UTC).
        #[arg(long = "as-of")]
        as_of: String,
        /// A directory or node inside the mount, under accounts/ACCOUNT.
        dir: PathBuf,
    },
    /// Unmount cleanly: everything acknowledged is durable, the daemon exits 0. Refused while busy unless --lazy.
    Umount {
        mountpoint: PathBuf,
        /// Seconds to wait for the daemon to finish.
        #[arg(long, default_value_t = 60)]
        timeout: u64,
        /// Detach even while processes use the mount; the daemon exits when they leave.
        #[arg(long)]
        lazy: bool,
    },
    /// Check the stored invariants of an unmounted data dir (exit 1 on violations).
    Fsck {
        #[arg(long, required_unless_present = "store")]
        data: Option<PathBuf>,
        /// A PostgreSQL store (postgres://…) in place of the data dir's.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
    },
    /// Write every ACTIVE node of an unmounted data dir as a plain directory
    /// tree (OUT/accounts/...), the layout of the context spec.
    Export {
        #[arg(long, required_unless_present = "store")]
        data: Option<PathBuf>,
        /// A PostgreSQL store (postgres://…) in place of the data dir's.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// Must not exist yet (written to a temp dir, renamed at the end).
        out: PathBuf,
    },
    /// Load such a tree into an unmounted data dir: every node is checked
    /// first; with any bad node nothing is imported (unless --skip-bad).
    Import {
        #[arg(long, required_unless_present = "store")]
        data: Option<PathBuf>,
        /// A PostgreSQL store (postgres://…) in place of the data dir's.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// Redaction policy of this config applies (default: built-in).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Import the good nodes and report the bad ones (exit status 1).
        #[arg(long)]
        skip_bad: bool,
        input: PathBuf,
    },
    /// Forget what deleted nodes left behind in an unmounted data dir: rewrite
    /// the store without freed pages, drop unused vectors and dead letters of
    /// deleted nodes, empty the log, graph dumps and daemon logs.
    Compact {
        #[arg(long)]
        data: PathBuf,
    },
    /// Re-wrap every data key of an encrypted store under a new master key
    /// (no data is rewritten). The current key comes from CTXFS_KEY_FILE or
    /// CTXFS_KEY_COMMAND; destroy it afterwards, and copies of deleted keys
    /// (backups, freed pages, PostgreSQL's WAL) can never be opened again.
    Rekey {
        #[arg(long)]
        data: Option<PathBuf>,
        /// A PostgreSQL store (postgres://…) in place of the data dir's.
        #[arg(long)]
        store: Option<String>,
        /// The new master key: a file of 64 hex digits, owner-only.
        #[arg(long, conflicts_with = "new_key_command")]
        new_key_file: Option<PathBuf>,
        /// Or a command printing it.
        #[arg(long)]
        new_key_command: Option<String>,
    },
    /// Delete a whole account, or one user's or agent's memory, from an
    /// unmounted data dir in one transaction (then mount once and compact to
    /// forget every trace).
    Delete {
        #[arg(long)]
        data: PathBuf,
        #[arg(long)]
        account: String,
        /// Only this user's memory (accounts/A/users/U).
        #[arg(long)]
        user: Option<String>,
        /// Only this agent's memory and skills (accounts/A/agents/G).
        #[arg(long)]
        agent: Option<String>,
    },
    /// Serve the mount over the Model Context Protocol on stdin/stdout, as
    /// the calling uid (tools: search, read, remember, update, forget, move,
    /// list, map, history, restore, memory; resources: the memory map and
    /// the prompt header).
    Mcp {
        /// A mounted ctxfs.
        #[arg(long)]
        mount: PathBuf,
        /// Paths are relative to this directory of the mount, and may not
        /// leave it (e.g. accounts/acme/users/alice). Default: the mount.
        #[arg(long)]
        scope: Option<String>,
    },
    /// The memory-tool protocol over a mount: one JSON command per line on
    /// stdin ({"command":"view","path":"/memories"}…), one JSON answer per
    /// line on stdout ({"ok":true,"text":…} or {"ok":false,"error":…}).
    Memtool {
        #[arg(long)]
        mount: PathBuf,
        /// The user or agent directory whose memories/ is /memories.
        #[arg(long)]
        scope: String,
    },
    /// Copy an unmounted data dir's embedded store (nodes with every
    /// version, index documents, vectors, pending events) into an empty
    /// PostgreSQL database, for `ctxfs mount --store URL`.
    Migrate {
        #[arg(long)]
        data: PathBuf,
        #[arg(long, value_name = "URL")]
        store: String,
    },
    /// Print a shell completion script (bash, zsh, fish) to stdout.
    Completions { shell: clap_complete::Shell },
    /// Print the manual page (roff) to stdout.
    Man,
    /// Run the Repair Job on an unmounted data dir and print what it did.
    Repair {
        /// The data dir whose saved drafts to repair.
        #[arg(long)]
        data: PathBuf,
        /// Its daemon's PostgreSQL store (postgres://…), if it serves one.
        #[arg(long, value_name = "URL")]
        store: Option<String>,
        /// Leave drafts touched within this many seconds alone.
        #[arg(long, default_value_t = 0)]
        grace: u64,
    },
    /// Copy what can still be read of a damaged data dir (store rows, intact
    /// write-ahead log records) into a new data dir; the damaged one is only read.
    Salvage {
        /// The damaged data dir (unmounted).
        #[arg(long)]
        data: PathBuf,
        /// The new data dir to write (must not exist, or be empty).
        #[arg(long)]
        out: PathBuf,
    },
}

/// Options of `ctxfs bench-ann`.
#[derive(clap::Args, Debug)]
pub struct BenchAnnOpts {
    /// A float32 .npy matrix (e.g. GloVe); its last QUERIES rows are the queries.
    #[arg(long)]
    pub npy: Option<PathBuf>,
    /// Use at most this many rows of the .npy.
    #[arg(long)]
    pub limit: Option<usize>,
    /// Or: an unmounted data dir and one of its accounts (its stored vectors).
    #[arg(long)]
    pub data: Option<PathBuf>,
    #[arg(long)]
    pub account: Option<String>,
    /// Query texts, one per line (with --data).
    #[arg(long)]
    pub queries_file: Option<PathBuf>,
    #[arg(long, default_value_t = 1000)]
    pub queries: usize,
    #[arg(long)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub embedder: Option<String>,
    #[arg(long)]
    pub model_dir: Option<PathBuf>,
    #[arg(long, default_value_t = 16)]
    pub m: usize,
    #[arg(long, default_value_t = 100)]
    pub ef_construction: usize,
}

pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("ctxfs");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/ctxfs")
}

/// `mount -t fuse.ctxfs SOURCE MOUNTPOINT -o OPTIONS` (and an fstab line
/// of type `fuse.ctxfs`) runs `ctxfs SOURCE MOUNTPOINT -o OPTIONS` through
/// mount.fuse3: turn that form into `ctxfs mount …`. SOURCE is the data
/// directory unless a `data=` option names one (`ctxfs` or `none`: the
/// default). Options of mount(8) itself are skipped; an unknown one is
/// refused with its name.
fn mount_helper_args(args: Vec<std::ffi::OsString>) -> Result<Vec<std::ffi::OsString>, String> {
    let first = args.get(1).and_then(|a| a.to_str()).unwrap_or("");
    let is_cmd = <Cli as clap::CommandFactory>::command()
        .get_subcommands()
        .any(|c| c.get_name() == first)
        || first == "help";
    if args.len() < 3 || first.starts_with('-') || is_cmd {
        return Ok(args);
    }
    let source = args[1].clone();
    let mut out: Vec<std::ffi::OsString> = vec![args[0].clone(), "mount".into(), args[2].clone()];
    let mut data = None;
    let mut rest = args[3..].iter();
    while let Some(a) = rest.next() {
        let opts = match a.to_str() {
            Some("-o") => rest
                .next()
                .and_then(|o| o.to_str())
                .unwrap_or("")
                .to_string(),
            Some(o) if o.starts_with("-o") => o[2..].to_string(),
            // mount.fuse3 may pass -n, -s, -f, -v: nothing for us.
            _ => continue,
        };
        for o in opts.split(',').filter(|o| !o.is_empty()) {
            let (k, v) = o.split_once('=').unwrap_or((o, ""));
            let flag = match k {
                "data" => {
                    data = Some(v.to_string());
                    continue;
                }
                "config" | "threads" | "embedder" | "model_dir" | "metrics_addr"
                | "draft_memory_mb" | "sweep_interval" | "repair_grace" | "store" | "views" => {
                    k.replace('_', "-")
                }
                "no_index" => {
                    out.push("--no-index".into());
                    continue;
                }
                // mount(8)'s and the kernel's generic options.
                "rw"
                | "defaults"
                | "auto"
                | "noauto"
                | "nofail"
                | "_netdev"
                | "user"
                | "nouser"
                | "users"
                | "dev"
                | "nodev"
                | "suid"
                | "nosuid"
                | "exec"
                | "noexec"
                | "atime"
                | "noatime"
                | "relatime"
                | "async"
                | "x-systemd.automount" => continue,
                k if k.starts_with("x-") || k.starts_with("comment") => continue,
                other => return Err(format!("unknown mount option {other:?} for fuse.ctxfs")),
            };
            out.push(format!("--{flag}").into());
            out.push(v.into());
        }
    }
    let data = data.or_else(|| {
        let s = source.to_string_lossy().into_owned();
        (s != "ctxfs" && s != "none").then_some(s)
    });
    if let Some(d) = data {
        out.push("--data".into());
        out.push(d.into());
    }
    Ok(out)
}

pub fn run() -> i32 {
    let args = match mount_helper_args(std::env::args_os().collect()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("ctxfs: {e}");
            return 1;
        }
    };
    let cli = Cli::parse_from(args);
    // Everything at rest is the owner's alone, whatever the caller's umask
    // (SEMANTICS "At rest"). The fronts write through the mount and the
    // generators to stdout: they keep the caller's umask.
    if !matches!(
        cli.cmd,
        Cmd::Completions { .. } | Cmd::Man | Cmd::Mcp { .. } | Cmd::Memtool { .. }
    ) {
        crate::daemon::owner_only_umask();
    }
    let (writer, to_file) = crate::daemon::log_writer();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,hnsw_rs=warn")),
        )
        .with_ansi(!to_file)
        .with_writer(writer)
        // A failed log write must not be reported on stderr: for the
        // background daemon that is the log file itself (see daemon::log).
        .log_internal_errors(false)
        .init();
    let result = match cli.cmd {
        Cmd::Mount {
            mountpoint,
            data,
            config,
            foreground,
            threads,
            repair_grace,
            sweep_interval,
            embedder,
            model_dir,
            no_index,
            metrics_addr,
            draft_memory_mb,
            store,
            views,
        } => {
            let opts = crate::daemon::MountOpts {
                mountpoint,
                data: data.unwrap_or_else(default_data_dir),
                config,
                threads: threads.clamp(1, 256),
                repair_grace: std::time::Duration::from_secs(repair_grace),
                sweep_interval: std::time::Duration::from_secs(sweep_interval.max(1)),
                embedder,
                model_dir,
                no_index,
                metrics_addr,
                draft_memory: draft_memory_mb.saturating_mul(1 << 20),
                store,
                views,
            };
            if foreground {
                crate::daemon::run_foreground(opts)
            } else {
                crate::daemon::start_background(opts)
            }
        }
        Cmd::Umount {
            mountpoint,
            timeout,
            lazy,
        } => crate::daemon::umount(&mountpoint, timeout, lazy),
        Cmd::Fsck { data, store } => crate::cmd::fsck(data.as_deref(), store.as_deref()),
        Cmd::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(shell, &mut cmd, "ctxfs", &mut std::io::stdout());
            Ok(0)
        }
        Cmd::Man => {
            let cmd = <Cli as clap::CommandFactory>::command();
            clap_mangen::Man::new(cmd)
                .render(&mut std::io::stdout())
                .map(|_| 0)
                .map_err(anyhow::Error::from)
        }
        Cmd::Compact { data } => crate::cmd::compact(&data),
        Cmd::Rekey {
            data,
            store,
            new_key_file,
            new_key_command,
        } => crate::cmd::rekey(
            data.as_deref(),
            store.as_deref(),
            new_key_file,
            new_key_command,
        ),
        Cmd::Migrate { data, store } => crate::cmd::migrate(&data, &store),
        Cmd::Mcp { mount, scope } => crate::fronts::Front::new(&mount, scope.as_deref())
            .map_err(|e| anyhow::anyhow!("{e}"))
            .and_then(crate::fronts::mcp::serve_stdio)
            .map(|_| 0),
        Cmd::Memtool { mount, scope } => crate::fronts::Front::new(&mount, Some(&scope))
            .map_err(|e| anyhow::anyhow!("{e}"))
            .and_then(|f| crate::fronts::memtool::serve_lines(&f))
            .map(|_| 0),
        Cmd::Delete {
            data,
            account,
            user,
            agent,
        } => crate::cmd::delete(&data, &account, user.as_deref(), agent.as_deref()),
        Cmd::Export { data, store, out } => {
            crate::cmd::export(data.as_deref(), store.as_deref(), &out)
        }
        Cmd::Import {
            data,
            store,
            config,
            skip_bad,
            input,
        } => crate::cmd::import(
            data.as_deref(),
            store.as_deref(),
            config.as_deref(),
            &input,
            skip_bad,
        ),
        Cmd::Reindex {
            data,
            store,
            config,
            embedder,
            model_dir,
        } => crate::cmd::reindex(
            data.as_deref(),
            store.as_deref(),
            config.as_deref(),
            embedder.as_ref(),
            model_dir.as_ref(),
        ),
        Cmd::BenchAnn(o) => crate::cmd::bench_ann(o.into()),
        Cmd::Search {
            query,
            dir,
            k,
            json,
            mode,
            budget,
        } => crate::cmd::search(&dir, &query, k, json, mode.as_deref(), budget),
        Cmd::Restore { as_of, dir } => crate::cmd::restore_as_of(&dir, &as_of),
        Cmd::Repair { data, store, grace } => crate::cmd::repair(
            Some(&data),
            store.as_deref(),
            std::time::Duration::from_secs(grace),
        ),
        Cmd::Salvage { data, out } => crate::cmd::salvage(&data, &out),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("ctxfs: {e:#}");
            1
        }
    }
}

impl From<BenchAnnOpts> for crate::cmd::BenchAnnOpts {
    fn from(o: BenchAnnOpts) -> Self {
        crate::cmd::BenchAnnOpts {
            npy: o.npy,
            limit: o.limit,
            data: o.data,
            account: o.account,
            queries_file: o.queries_file,
            queries: o.queries,
            config: o.config,
            embedder: o.embedder,
            model_dir: o.model_dir,
            m: o.m,
            ef_construction: o.ef_construction,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mount_helper_args;
    use std::ffi::OsString;

    fn args(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn mount_helper_form_becomes_ctxfs_mount() {
        let got = mount_helper_args(args(&[
            "/sbin/mount.fuse.ctxfs",
            "/var/lib/ctxfs",
            "/mnt/m",
            "-o",
            "rw,config=/etc/c.toml,no_index,_netdev,threads=4",
        ]))
        .unwrap();
        assert_eq!(
            got,
            args(&[
                "/sbin/mount.fuse.ctxfs",
                "mount",
                "/mnt/m",
                "--config",
                "/etc/c.toml",
                "--no-index",
                "--threads",
                "4",
                "--data",
                "/var/lib/ctxfs"
            ])
        );
        let got = mount_helper_args(args(&["ctxfs", "ctxfs", "/mnt/m", "-odata=/d"])).unwrap();
        assert_eq!(got, args(&["ctxfs", "mount", "/mnt/m", "--data", "/d"]));
        // Ordinary command lines pass unchanged.
        for a in [
            &["ctxfs", "mount", "/mnt/m"][..],
            &["ctxfs", "--help"],
            &["ctxfs", "fsck", "--data", "d"],
        ] {
            assert_eq!(mount_helper_args(args(a)).unwrap(), args(a));
        }
        assert!(mount_helper_args(args(&["ctxfs", "d", "/m", "-o", "bogus=1"])).is_err());
    }
}
