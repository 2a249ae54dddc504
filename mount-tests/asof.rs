//! Memory as of a time: `accounts/A/.as-of/T/` is the account as it stood
//! at T, read-only, with real processes (`cat`, `ls`, `grep -r`, `find`)
//! as the account's reader, its writer and a stranger.

use crate::harness::*;

const NOTES: &str = "acme/users/alice/memories/notes";

/// The time now as `.as-of/` takes it, to the nanosecond, between two
/// short pauses (no commit shares its instant).
fn instant(m: &Mount) -> String {
    std::thread::sleep(std::time::Duration::from_millis(50));
    let t = m
        .ok(WRITER, "date -u +%Y-%m-%dT%H:%M:%S.%NZ")
        .trim()
        .to_string();
    std::thread::sleep(std::time::Duration::from_millis(50));
    t
}

/// `cat PATH` (under the mount) as `uid`.
fn cat(m: &Mount, uid: u32, path: &str) -> String {
    m.ok(uid, &format!("cat \"{path}\""))
}

#[test]
fn the_tree_as_it_stood_then_read_only_and_deletes_stay_deleted() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/a"), "alpha one", ACTIVE),
    );
    m.ok(WRITER, &four_steps(&format!("{NOTES}/b"), "bravo", ACTIVE));
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/d"), "delta, deleted later", ACTIVE),
    );
    let t1 = instant(&m);
    // After T1: a new version of a, a new node c, b moved, d deleted.
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/a"), "alpha two", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/c"), "charlie", ACTIVE),
    );
    m.ok(
        WRITER,
        "mkdir -p \"$M/accounts/acme/users/alice/memories/moved\" && \
         mv \"$M/accounts/acme/users/alice/memories/notes/b\" \"$M/accounts/acme/users/alice/memories/moved/b\"",
    );
    m.ok(
        WRITER,
        "rm -r \"$M/accounts/acme/users/alice/memories/notes/d\"",
    );

    let then = format!("$M/accounts/acme/.as-of/{t1}/users/alice/memories");
    let now = "$M/accounts/acme/users/alice/memories";
    // The reader sees the past: a's first version, b where it was, no c,
    // and no d (a delete forgets a node's history).
    assert_eq!(
        cat(&m, READER, &format!("{then}/notes/a/content.md")),
        "alpha one"
    );
    assert_eq!(
        cat(&m, READER, &format!("{now}/notes/a/content.md")),
        "alpha two"
    );
    assert_eq!(m.ok(READER, &format!("ls \"{then}/notes\"")), "a\nb\n");
    assert_eq!(m.ok(READER, &format!("ls \"{then}\"")), "notes\n");
    assert_eq!(
        cat(&m, READER, &format!("{then}/notes/b/content.md")),
        "bravo"
    );
    m.fails(READER, &format!("ls \"{then}/notes/c\""), "No such file");
    m.fails(READER, &format!("ls \"{then}/notes/d\""), "No such file");
    m.fails(READER, &format!("ls \"{then}/moved\""), "No such file");
    let meta = m.json(READER, &format!("cat \"{then}/notes/a/.meta.json\""));
    assert_eq!(meta["version"], 1, "{meta}");
    assert_eq!(meta["status"], "ACTIVE", "{meta}");
    // The shell's tools walk it like any tree.
    let found = m.ok(READER, &format!("grep -rl alpha \"{then}\""));
    assert_eq!(found.lines().count(), 1, "{found}");
    assert!(found.trim_end().ends_with("notes/a/content.md"), "{found}");
    let files = m.ok(READER, &format!("find \"{then}\" -name content.md | wc -l"));
    assert_eq!(files.trim(), "2");
    // Now, the same view names today's tree.
    let today = instant(&m);
    assert_eq!(
        m.ok(
            READER,
            &format!("ls \"$M/accounts/acme/.as-of/{today}/users/alice/memories\"")
        ),
        "moved\nnotes\n"
    );
    // A day: its first instant in UTC; long ago the account held nothing.
    assert_eq!(
        m.ok(READER, "ls \"$M/accounts/acme/.as-of/2020-01-01\""),
        ""
    );
    // `.as-of/` lists nothing: a time is reached by its name.
    assert_eq!(m.ok(READER, "ls -A \"$M/accounts/acme/.as-of\""), "");
    m.fails(
        READER,
        "ls \"$M/accounts/acme/.as-of/yesterday\"",
        "Invalid argument",
    );
    m.fails(
        READER,
        "ls \"$M/accounts/acme/.as-of/2099-01-01\"",
        "No such file",
    );

    // Read-only for the writer too: no file, directory, removal or move.
    m.fails(
        WRITER,
        &format!("touch \"{then}/notes/a/new.md\""),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("mkdir \"{then}/notes/e\""),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("rm \"{then}/notes/a/content.md\""),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("mv \"{then}/notes/a\" \"{now}/notes/a2\""),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("mv \"{now}/notes/a\" \"{then}/notes/a2\""),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("rmdir \"{then}/notes/a\""),
        "Read-only file system",
    );
    m.fails(WRITER, "rm \"$M/accounts/acme/.as-of\"", "Is a directory");
    m.fails(
        WRITER,
        &format!("echo x > \"{then}/notes/a/content.md\""),
        "not permitted",
    );
    assert_eq!(
        cat(&m, WRITER, &format!("{now}/notes/a/content.md")),
        "alpha two"
    );
    // Tenancy: another account's uid sees nothing of it.
    m.fails(
        STRANGER,
        &format!("ls \"$M/accounts/acme/.as-of/{t1}\""),
        "Permission denied",
    );
    m.fails(
        STRANGER,
        &format!("cat \"{then}/notes/a/content.md\""),
        "Permission denied",
    );
    m.umount_and_fsck();
}

/// A node deleted and made again at the same path is another node: the
/// view at a time before shows the first one's text only while it lives,
/// and never the new node's versions as the old one's.
#[test]
fn a_node_made_again_at_a_path_is_not_the_old_one() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/x"), "first life", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/x"), "first life, v2", ACTIVE),
    );
    let t1 = instant(&m);
    let then = format!("$M/accounts/acme/.as-of/{t1}/users/alice/memories/notes");
    assert_eq!(
        cat(&m, READER, &format!("{then}/x/content.md")),
        "first life, v2"
    );
    m.ok(WRITER, &format!("rm -r \"$M/accounts/{NOTES}/x\""));
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/x"), "second life", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/x"), "second life, v2", ACTIVE),
    );
    // At T1 the second node did not exist, and the first is forgotten.
    m.fails(
        READER,
        &format!("cat \"{then}/x/content.md\""),
        "No such file",
    );
    let left = m.ok(READER, &format!("ls \"{then}\" 2>/dev/null || true"));
    assert!(!left.contains('x'), "{left}");
    m.umount_and_fsck();
}

/// `echo PATH > .as-of/T/restore` commits every node under PATH that
/// changed since T as it was then, in one transaction; `cat restore` gives
/// the result; nodes made since are left; readers get EROFS.
#[test]
fn a_subtree_restored_as_it_was_then() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/a"), "alpha one", ACTIVE),
    );
    m.ok(WRITER, &four_steps(&format!("{NOTES}/b"), "bravo", ACTIVE));
    m.ok(
        WRITER,
        &four_steps("acme/users/bob/memories/notes/z", "bob one", ACTIVE),
    );
    let t1 = instant(&m);
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/a"), "alpha two", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/a"), "alpha three", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/c"), "charlie, made later", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps("acme/users/bob/memories/notes/z", "bob two", ACTIVE),
    );
    let restore = format!("$M/accounts/acme/.as-of/{t1}/restore");
    let now = "$M/accounts/acme/users";
    // Readers may read the rules, not restore.
    assert!(cat(&m, READER, &restore).contains("echo users/alice"));
    m.fails(
        READER,
        &format!("/bin/echo users/alice > \"{restore}\""),
        "Read-only file system",
    );
    m.fails(
        WRITER,
        &format!("/bin/echo users/nobody > \"{restore}\""),
        "No such file",
    );
    m.fails(
        WRITER,
        &format!("/bin/echo ../other > \"{restore}\""),
        "Invalid argument",
    );
    // A path longer than a version number is taken (nothing is under it).
    let long = format!("users/alice/memories/{}", "n".repeat(120));
    m.fails(
        WRITER,
        &format!("/bin/echo {long} > \"{restore}\""),
        "No such file",
    );
    m.ok(WRITER, &format!("/bin/echo users/alice > \"{restore}\""));
    // a is as it was, as version 4; b had not changed; c stays; bob's
    // node, outside the path, keeps its second version.
    assert_eq!(
        cat(
            &m,
            READER,
            &format!("{now}/alice/memories/notes/a/content.md")
        ),
        "alpha one"
    );
    let meta = m.json(
        READER,
        &format!("cat \"{now}/alice/memories/notes/a/.meta.json\""),
    );
    assert_eq!(meta["version"], 4, "{meta}");
    assert_eq!(meta["restored_from"], 1, "{meta}");
    assert_eq!(
        cat(
            &m,
            READER,
            &format!("{now}/alice/memories/notes/c/content.md")
        ),
        "charlie, made later"
    );
    assert_eq!(
        cat(
            &m,
            READER,
            &format!("{now}/bob/memories/notes/z/content.md")
        ),
        "bob two"
    );
    let result = cat(&m, WRITER, &restore);
    assert!(
        result.contains(r#""node":"users/alice/memories/notes/a","restored_from":1,"version":4"#),
        "{result}"
    );
    assert!(
        result.contains(r#""node":"users/alice/memories/notes/b","unchanged":true"#),
        "{result}"
    );
    // The node made since is left, and the result says so.
    assert!(
        result.contains(r#""left":true,"made_since":true,"node":"users/alice/memories/notes/c""#),
        "{result}"
    );
    // The whole account, again: only bob's node has changed since.
    m.ok(WRITER, &format!("/bin/echo / > \"{restore}\""));
    assert_eq!(
        cat(
            &m,
            READER,
            &format!("{now}/bob/memories/notes/z/content.md")
        ),
        "bob one"
    );
    m.umount_and_fsck();
}

/// Result paths of a search file (TSV), read as `uid`.
fn results(m: &Mount, uid: u32, file: &str) -> Vec<String> {
    m.ok(uid, &format!("cat \"{file}\""))
        .lines()
        .map(|l| l.split('\t').nth(2).unwrap_or("").to_string())
        .collect()
}

#[test]
fn search_of_the_past_finds_the_versions_current_then() {
    let m = Mount::with_args(Some(CONFIG), &["--embedder", "hash"]);
    let kite = format!("{NOTES}/kite");
    m.ok(
        WRITER,
        &four_steps(&kite, "the red kite nests in the old oak", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/gone"), "the oak loses a branch", ACTIVE),
    );
    assert_eq!(m.ok(0, "cat $M/.ctxfs/sync"), "ok\n");
    let t1 = instant(&m);
    m.ok(
        WRITER,
        &four_steps(&kite, "the red kite moved to the pine wood", ACTIVE),
    );
    m.ok(
        WRITER,
        &four_steps(&format!("{NOTES}/later"), "an oak planted later", ACTIVE),
    );
    m.ok(WRITER, &format!("rm -r \"$M/accounts/{NOTES}/gone\""));
    assert_eq!(m.ok(0, "cat $M/.ctxfs/sync"), "ok\n");

    let view = format!("$M/accounts/acme/.as-of/{t1}");
    let kite_then = format!("accounts/acme/.as-of/{t1}/users/alice/memories/notes/kite");
    // The past: the kite in the oak, and nothing made or deleted since.
    for dir in [view.clone(), format!("{view}/users/alice")] {
        let got = results(&m, READER, &format!("{dir}/.search/oak"));
        assert_eq!(got, vec![kite_then.clone()], "{dir}");
    }
    // Its path reads the version current then.
    assert_eq!(
        cat(&m, READER, &format!("$M/{kite_then}/content.md")),
        "the red kite nests in the old oak"
    );
    // The live tree: the new version, the new node.
    let live = results(&m, READER, "$M/accounts/acme/.search/oak?mode=lexical");
    assert!(!live.iter().any(|p| p.contains("/kite")), "{live:?}");
    assert!(live.iter().any(|p| p.ends_with("/later")), "{live:?}");
    assert!(results(&m, READER, &format!("{view}/.search/pine?mode=lexical")).is_empty());
    assert_eq!(
        results(&m, READER, &format!("{view}/.search/nests?mode=lexical")),
        vec![kite_then.clone()]
    );
    // JSON says where it searched.
    let j = m.json(READER, &format!("cat \"{view}/.search/oak?format=json\""));
    assert_eq!(j["scope"], format!("accounts/acme/.as-of/{t1}"), "{j}");
    assert_eq!(j["results"][0]["path"], kite_then.as_str(), "{j}");
    // What the past search does not take, and who may not search.
    m.fails(
        READER,
        &format!("cat \"{view}/.search/oak?budget=100\""),
        "Invalid argument",
    );
    m.fails(
        STRANGER,
        &format!("cat \"{view}/.search/oak\""),
        "Permission denied",
    );
    m.fails(
        WRITER,
        &format!("touch \"{view}/.search/oak\""),
        "Operation not permitted",
    );
    // A version redacted since is not found by its old words.
    m.ok(
        WRITER,
        &format!("/bin/echo 1 > \"$M/accounts/{kite}/.versions/redact\""),
    );
    assert!(results(&m, READER, &format!("{view}/.search/oak")).is_empty());
    assert!(results(&m, READER, &format!("{view}/.search/kite")).is_empty());
}
