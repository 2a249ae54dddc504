//! Encryption at rest (`[encryption]`, SEMANTICS "Encryption at rest"):
//! no text of a tenant is in any file of the data dir or of a PostgreSQL
//! database, its dump or its WAL; deleting a user destroys its keys; the
//! master key rotates without rewriting data.

use crate::harness::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A master key file (64 hex digits, owner-only) in its own directory.
pub fn key_file(dir: &Path, name: &str) -> PathBuf {
    use std::io::Read;
    let mut raw = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut raw)
        .unwrap();
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    let p = dir.join(name);
    std::fs::write(&p, hex).unwrap();
    chmod(&p, 0o600);
    p
}

pub fn keys_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ctxfs-keys-")
        .tempdir_in("/tmp")
        .unwrap()
}

fn encrypted_config(key: &Path) -> String {
    format!("{CONFIG}\n[encryption]\nkey_file = \"{}\"\n", key.display())
}

/// The files under `dirs` (as root) that hold `word`.
pub fn holders(word: &str, dirs: &[&Path]) -> String {
    let mut cmd = Command::new("grep");
    cmd.args(["-rlaF", word]);
    for d in dirs {
        cmd.arg(d);
    }
    String::from_utf8_lossy(&cmd.output().unwrap().stdout).into_owned()
}

/// `s` as pg_dump shows it in a bytea column.
fn hexed(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

/// `ctxfs ARGS` with the master key of `key` in the environment.
pub fn ctxfs_with_key(key: &Path, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("CTXFS_KEY_FILE", key)
        .output()
        .unwrap()
}

const ALICE: &str = "acme/users/alice/memories/pets/dog";
const BOB: &str = "acme/users/bob/memories/pets/cat";

/// Every kind of stored text of two users (nodes with two versions, the
/// index, a scratchpad file, the activity log, a draft saved at unmount)
/// is in no file of the data dir; deleting alice destroys her keys, so her
/// words are gone for good while bob's stay readable; a backup taken before
/// the delete opens with the old master key only, and `ctxfs rekey` moves
/// the store to a new one without rewriting it.
#[test]
fn an_encrypted_data_dir_holds_no_text_and_a_deleted_user_is_forgotten() {
    let keys = keys_dir();
    let key = key_file(keys.path(), "master.key");
    let mut m = Mount::with_config(Some(&encrypted_config(&key)));
    m.ok(WRITER, &four_steps(ALICE, "our dog Zorblefish v1", ACTIVE));
    m.ok(
        WRITER,
        &four_steps(ALICE, "our dog Zorblefish loves Snowcrunch", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(BOB, "the cat of bob Quillberry", ACTIVE),
    );
    let p = "$M/accounts/acme/projects/launch";
    m.ok(
        WRITER,
        &format!(
            "mkdir -p {p} && mkdir -p {p}/scratchpad && echo 'plan Scratchmark' > {p}/scratchpad/plan.txt \
             && echo '{{\"note\":\"Logmark\"}}' >> {p}/activity_log.jsonl"
        ),
    );
    // A draft (no commit) is saved at unmount.
    m.ok(
        WRITER,
        "mkdir -p \"$M/accounts/acme/users/bob/memories/pets/wip\" && \
         echo 'unfinished Draftmark' > \"$M/accounts/acme/users/bob/memories/pets/wip/content.md\"",
    );
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = m.ok(
        READER,
        "cat \"$M/accounts/acme/.search/Zorblefish Snowcrunch\"",
    );
    assert!(hits.contains("pets/dog"), "{hits}");
    assert_eq!(
        m.ok(WRITER, &format!("cat {p}/scratchpad/plan.txt")),
        "plan Scratchmark\n"
    );
    let words = [
        "Zorblefish",
        "Snowcrunch",
        "Quillberry",
        "Scratchmark",
        "Logmark",
        "Draftmark",
    ];
    for w in words {
        assert_eq!(holders(w, &[&m.data]), "", "{w} in the clear while mounted");
    }
    let status = m.json(0, "cat $M/.ctxfs/status");
    assert_eq!(status["encrypted"], true, "{status}");
    // alice, bob, and the account's own (scratchpad, audit trail).
    assert_eq!(status["data_keys"], 3, "{status}");
    m.umount();
    for w in words {
        assert_eq!(holders(w, &[&m.data]), "", "{w} in the clear after unmount");
    }
    m.fsck();
    let backup = m.dir.path().join("backup");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&m.data)
        .arg(&backup)
        .status()
        .unwrap();
    assert!(cp.success());

    // Without the key, or with another, the store is refused, saying why.
    let out = ctxfs(&[
        "export",
        "--data",
        m.data.to_str().unwrap(),
        "/tmp/ctxfs-never",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("encrypted") && err.contains("CTXFS_KEY_FILE"),
        "{err}"
    );
    let other = key_file(keys.path(), "other.key");
    let out = ctxfs_with_key(
        &other,
        &[
            "export",
            "--data",
            m.data.to_str().unwrap(),
            "/tmp/ctxfs-never",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("does not open this store's keyring"),
        "{err}"
    );

    // alice's user directory goes, as a writer removes it.
    m.mount();
    m.ok(WRITER, "rm -rf \"$M/accounts/acme/users/alice\"");
    m.ok(WRITER, "cat $M/.ctxfs/sync");
    let hits = m.ok(READER, "cat \"$M/accounts/acme/.search/Zorblefish\"");
    assert!(!hits.contains("pets/dog"), "{hits}");
    let status = m.json(0, "cat $M/.ctxfs/status");
    assert_eq!(status["data_keys"], 2, "{status}");
    assert_eq!(
        m.ok(READER, &format!("cat \"$M/accounts/{BOB}/content.md\"")),
        "the cat of bob Quillberry"
    );
    m.umount();
    m.fsck();
    let data = m.data.to_str().unwrap();
    let out_dir = m.dir.path().join("export");
    let out = ctxfs_with_key(&key, &["export", "--data", data, out_dir.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(holders("Quillberry", &[&out_dir]).contains("cat/content.md"));
    assert_eq!(holders("Zorblefish", &[&out_dir]), "");

    // Rekeying to the key in use is refused: its advice to destroy "the
    // old key" would destroy the only one.
    let rekey_to = |to: &Path| {
        ctxfs_with_key(
            &key,
            &[
                "rekey",
                "--data",
                data,
                "--new-key-file",
                to.to_str().unwrap(),
            ],
        )
    };
    let out = rekey_to(&key);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("the one in use"),
        "{said}{out:?}"
    );
    // The master key rotates; the backup from before the delete opens with
    // the old key only: destroying it forgets alice there too.
    let new = key_file(keys.path(), "new.key");
    let out = rekey_to(&new);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && said.contains("2 data key(s)"),
        "{said}{out:?}"
    );
    let again = m.dir.path().join("export2");
    let out = ctxfs_with_key(&new, &["export", "--data", data, again.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(holders("Quillberry", &[&again]).contains("cat/content.md"));
    let out = ctxfs_with_key(&key, &["fsck", "--data", data]);
    assert!(out.status.success(), "{out:?}");
    let old = m.dir.path().join("export3");
    let out = ctxfs_with_key(
        &new,
        &[
            "export",
            "--data",
            backup.to_str().unwrap(),
            old.to_str().unwrap(),
        ],
    );
    assert!(!out.status.success(), "the backup opened with the new key");
    // The new key serves the mount.
    let cfg = m.config.clone().unwrap();
    std::fs::write(&cfg, encrypted_config(&new)).unwrap();
    m.mount();
    assert_eq!(
        m.ok(READER, &format!("cat \"$M/accounts/{BOB}/content.md\"")),
        "the cat of bob Quillberry"
    );
    m.umount_and_fsck();
}

/// A store written without encryption is never encrypted in place, and an
/// encrypted one never served without its key: both refused with the way
/// out.
#[test]
fn encryption_is_a_property_of_the_store() {
    let keys = keys_dir();
    let key = key_file(keys.path(), "master.key");
    let mut m = Mount::with_config(Some(CONFIG));
    m.ok(WRITER, &four_steps(BOB, "plain words", ACTIVE));
    m.umount();
    std::fs::write(m.config.as_ref().unwrap(), encrypted_config(&key)).unwrap();
    let out = m.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("does not encrypt a store in place"),
        "{err}"
    );
    // A key file others may read is refused with the chmod that fixes it.
    let mut e = Mount::prepared(Some(&encrypted_config(&key)), &[], &[], &[]);
    chmod(&key, 0o644);
    let out = e.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("chmod 600"), "{err}");
    // Refused before anything of the data dir is made.
    assert!(!e.data.exists(), "a refused key made the data dir");
    chmod(&key, 0o600);
    e.mount();
    e.ok(WRITER, &four_steps(BOB, "sealed words", ACTIVE));
    e.umount();
    std::fs::write(e.config.as_ref().unwrap(), CONFIG).unwrap();
    let out = e.try_mount();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("this store is encrypted"),
        "{err}"
    );
}

/// On PostgreSQL: no text in the database (`pg_dump`) or the server's WAL;
/// a second daemon with the same master key reads what the first wrote and
/// learns of a deleted user's keys; after the delete, the dump holds no
/// key of that user.
#[test]
fn on_postgresql_no_dump_or_wal_holds_text_and_deletes_forget() {
    let keys = keys_dir();
    let key = key_file(keys.path(), "master.key");
    let db = PgDb::new();
    let cfg = encrypted_config(&key);
    let mut a = db.mount(Some(&cfg), &[]);
    let mut b = db.mount(Some(&cfg), &[]);
    a.ok(WRITER, &four_steps(ALICE, "our dog Pgzorble", ACTIVE));
    a.ok(WRITER, &four_steps(BOB, "the cat of bob Pgquill", ACTIVE));
    a.ok(WRITER, "cat $M/.ctxfs/sync");
    let seen = within(Duration::from_secs(10), || {
        b.sh(READER, &format!("cat \"$M/accounts/{ALICE}/content.md\""))
            .stdout
            == b"our dog Pgzorble"
    });
    assert!(
        seen.is_some(),
        "the second daemon did not read the sealed node"
    );
    let hits = b.ok(READER, "cat \"$M/accounts/acme/.search/Pgzorble\"");
    assert!(hits.contains("pets/dog"), "{hits}");
    let dump = db.dump();
    for w in ["Pgzorble", "Pgquill"] {
        // bytea columns are dumped in hex.
        assert!(
            !dump.contains(w) && !dump.contains(&hexed(w)),
            "{w} in pg_dump"
        );
    }
    let wal = PathBuf::from(db.datadir()).join("pg_wal");
    for w in ["Pgzorble", "Pgquill"] {
        assert_eq!(holders(w, &[&wal]), "", "{w} in the server's WAL");
    }
    let alice_rows = |d: &str| d.matches("acme/users/alice").count();
    assert!(alice_rows(&dump) > 0);
    a.ok(WRITER, "rm -rf \"$M/accounts/acme/users/alice\"");
    let dump = db.dump();
    assert!(
        !dump.contains(&hexed("\"scope\":\"acme/users/alice\"")),
        "alice's key row is still in the database"
    );
    assert!(dump.contains(&hexed("\"scope\":\"acme/users/bob\"")));
    // The other daemon reads bob's node still, and alice's no more.
    let gone = within(Duration::from_secs(10), || {
        !b.sh(READER, &format!("cat \"$M/accounts/{ALICE}/content.md\""))
            .status
            .success()
    });
    assert!(gone.is_some());
    assert_eq!(
        b.ok(READER, &format!("cat \"$M/accounts/{BOB}/content.md\"")),
        "the cat of bob Pgquill"
    );
    // fsck opens every sealed blob it reads in batches: clean, with the key.
    a.umount();
    b.umount();
    let out = ctxfs_with_key(&key, &["fsck", "--store", &db.url]);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("clean"),
        "{out:?}"
    );
}
