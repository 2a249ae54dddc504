//! Access below the account: a user's uid reaches its own user's memory,
//! the account's projects and the agents it is given; an agent's uid its
//! own memory and the users it serves. Each attack is run as that uid
//! (`setpriv`) through the real mount.

use crate::harness::*;

const MEMBERS: &str = r#"
[[account]]
id = "acme"
writers = [1001]
readers = [1002]

[[account.user]]
id = "alice"
uids = [1201]
agents = ["helper"]

[[account.user]]
id = "bob"
uids = [1202]

[[account.agent]]
id = "helper"
uids = [1301]
users = ["bob"]

[[account]]
id = "other"
writers = [1003]
"#;

const ALICE: u32 = 1201;
const BOB: u32 = 1202;
const HELPER: u32 = 1301;

const A1: &str = "acme/users/alice/memories/events/a1";
const B1: &str = "acme/users/bob/memories/events/b1";
const SKILL: &str = "acme/agents/helper/skills/triage";

fn cat(m: &Mount, uid: u32, node: &str) -> String {
    m.ok(uid, &format!("cat $M/accounts/{node}/content.md"))
}

#[test]
fn users_and_agents_reach_only_their_own_part() {
    let m = Mount::with_config(Some(MEMBERS));
    m.ok(WRITER, &four_steps(A1, "alice likes marmalade", ACTIVE));
    m.ok(WRITER, &four_steps(B1, "bob keeps bees", ACTIVE));
    m.ok(
        WRITER,
        &four_steps(SKILL, "triage tickets by urgency", ACTIVE),
    );

    // Bob reads his node first: its entries are in the kernel's caches when
    // Alice tries, twice over.
    for _ in 0..2 {
        assert_eq!(cat(&m, BOB, B1), "bob keeps bees");
        assert_eq!(cat(&m, ALICE, A1), "alice likes marmalade");
        for cmd in [
            format!("cat $M/accounts/{B1}/content.md"),
            format!("stat $M/accounts/{B1}"),
            "ls $M/accounts/acme/users/bob".to_string(),
            "ls $M/accounts/acme/users/bob/inbox".to_string(),
            "cat $M/accounts/acme/users/bob/README.md".to_string(),
            format!("echo x > $M/accounts/{B1}/content.md"),
            "mkdir -p $M/accounts/acme/users/bob/memories/events/new".to_string(),
            "mkdir $M/accounts/acme/users/carol".to_string(),
            "ls $M/accounts/acme/agents/other".to_string(),
        ] {
            m.fails(ALICE, &cmd, "Permission denied");
        }
        // Listings above the parts show each caller what it may reach.
        assert_eq!(m.ok(ALICE, "ls $M/accounts/acme/users"), "alice\n");
        assert_eq!(m.ok(BOB, "ls $M/accounts/acme/users"), "bob\n");
        assert_eq!(m.ok(HELPER, "ls $M/accounts/acme/users"), "bob\n");
        assert_eq!(m.ok(WRITER, "ls $M/accounts/acme/users"), "alice\nbob\n");
        assert_eq!(m.ok(ALICE, "ls $M/accounts/acme/agents"), "helper\n");
        assert_eq!(m.ok(BOB, "ls $M/accounts/acme/agents"), "");
        assert_eq!(m.ok(ALICE, "ls $M/accounts"), "acme\n");
    }
    // grep -r from the account finds Alice's text, never Bob's.
    assert!(m
        .ok(ALICE, "grep -rl marmalade $M/accounts/acme")
        .contains("users/alice/memories/events/a1/content.md"));
    assert_eq!(m.ok(ALICE, "grep -rl bees $M/accounts/acme; true"), "");
    assert_eq!(m.ok(ALICE, "find $M/accounts/acme -path '*bob*'; true"), "");

    // Alice writes her own part and the projects; reads the agent given to
    // her and may not change it.
    m.ok(
        ALICE,
        &four_steps(
            "acme/users/alice/memories/events/a2",
            "alice plays oboe",
            ACTIVE,
        ),
    );
    m.ok(
        ALICE,
        "mkdir -p $M/accounts/acme/projects/p/scratchpad && echo plan > $M/accounts/acme/projects/p/scratchpad/notes",
    );
    assert_eq!(
        m.ok(BOB, "cat $M/accounts/acme/projects/p/scratchpad/notes"),
        "plan\n"
    );
    assert_eq!(cat(&m, ALICE, SKILL), "triage tickets by urgency");
    m.fails(
        ALICE,
        &format!("echo x > $M/accounts/{SKILL}/content.md"),
        "Read-only file system",
    );
    m.fails(
        BOB,
        &format!("cat $M/accounts/{SKILL}/content.md"),
        "Permission denied",
    );

    // The agent: its own memory and its users', no one else's.
    assert_eq!(cat(&m, HELPER, B1), "bob keeps bees");
    m.ok(
        HELPER,
        &four_steps(
            "acme/users/bob/memories/events/b2",
            "bob moved to Leeds",
            ACTIVE,
        ),
    );
    m.ok(
        HELPER,
        &four_steps(
            "acme/agents/helper/memories/notes/n1",
            "helper note",
            ACTIVE,
        ),
    );
    m.fails(
        HELPER,
        &format!("cat $M/accounts/{A1}/content.md"),
        "Permission denied",
    );

    // Moves neither into nor out of one's part.
    m.fails(
        ALICE,
        &format!("mv $M/accounts/{A1} $M/accounts/acme/users/bob/memories/events/stolen"),
        "Permission denied",
    );
    m.fails(
        HELPER,
        &format!("mv $M/accounts/{B1} $M/accounts/acme/users/alice/memories/events/b1"),
        "Permission denied",
    );

    // A batch: the lines in one's part commit, the others are refused.
    let out = m.ok(
        ALICE,
        r#"printf '%s\n' '{"node":"users/alice/memories/events/a3","content":"alice batch","meta":{"status":"ACTIVE"}}' '{"node":"users/bob/memories/events/b9","content":"planted","meta":{"status":"ACTIVE"}}' > $M/accounts/acme/.ctxfs/batch 2>/dev/null; cat $M/accounts/acme/.ctxfs/batch"#,
    );
    assert!(out.contains(r#""version":1"#), "{out}");
    assert!(out.contains("outside what this uid may write"), "{out}");
    m.fails(
        WRITER,
        "cat $M/accounts/acme/users/bob/memories/events/b9/content.md",
        "No such file",
    );
    // Links: none is stored, to one's own part or another's.
    for cmd in [
        format!("ln $M/accounts/{A1}/content.md $M/accounts/acme/users/alice/memories/events/a2/copy.md"),
        format!("ln -s $M/accounts/{B1}/content.md $M/accounts/acme/users/alice/memories/events/a2/link.md"),
    ] {
        m.fails(ALICE, &cmd, "Operation not permitted");
    }
    // The account's audit trail is its writers'.
    m.fails(
        ALICE,
        "cat $M/accounts/acme/.ctxfs/audit",
        "Permission denied",
    );

    // The account's writers and readers keep their rights; nothing of Bob's changed.
    assert_eq!(cat(&m, READER, A1), "alice likes marmalade");
    assert_eq!(cat(&m, WRITER, B1), "bob keeps bees");
    assert_eq!(
        m.ok(WRITER, "ls $M/accounts/acme/users/bob/memories/events"),
        "b1\nb2\n"
    );
    m.fails(ALICE, "ls $M/accounts/other", "Permission denied");
}

#[test]
fn search_header_and_the_past_show_only_ones_own_part() {
    let m = Mount::with_config(Some(MEMBERS));
    m.ok(WRITER, &four_steps(A1, "alice grows tomatoes", ACTIVE));
    m.ok(WRITER, &four_steps(B1, "bob grows tomatoes too", ACTIVE));
    // Alice relates her node to Bob's: the relation brings nothing of his.
    let rel = m.shared_file("rel.json");
    std::fs::write(
        &rel,
        format!(
            r#"[{{"from_uri":"ctx://{A1}","to_uri":"ctx://{B1}","relation_type":"related_to","weight":1.0}}]"#
        ),
    )
    .unwrap();
    m.ok(
        ALICE,
        &format!(
            "cp {} $M/accounts/{A1}/.relations.json && /bin/echo '{ACTIVE}' > $M/accounts/{A1}/.meta.json",
            rel.display()
        ),
    );
    assert_eq!(m.ok(0, "cat $M/.ctxfs/sync"), "ok\n");
    for dir in ["acme", "acme/users", "acme/users/alice"] {
        let out = m.ok(
            ALICE,
            &format!("cat \"$M/accounts/{dir}/.search/tomatoes\""),
        );
        assert!(
            out.contains("users/alice/memories/events/a1"),
            "{dir}: {out}"
        );
        assert!(!out.contains("users/bob"), "{dir}: {out}");
    }
    // The writer sees both.
    let out = m.ok(WRITER, "cat \"$M/accounts/acme/.search/tomatoes\"");
    assert!(
        out.contains("users/bob") && out.contains("users/alice"),
        "{out}"
    );
    m.fails(
        ALICE,
        "cat \"$M/accounts/acme/users/bob/.search/tomatoes\"",
        "Permission denied",
    );

    // The header and the memory map.
    let header = m.ok(ALICE, "cat $M/.ctxfs/header");
    assert!(
        header.contains("users/alice") && !header.contains("users/bob"),
        "{header}"
    );
    m.ok(ALICE, "cat $M/accounts/acme/users/alice/README.md");

    // The account as of now: Alice's part only.
    // A whole second after the commits, and already past.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let t = m.ok(0, "date -u +%Y-%m-%dT%H:%M:%SZ").trim().to_string();
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let view = format!("$M/accounts/acme/.as-of/{t}");
    assert_eq!(m.ok(ALICE, &format!("ls {view}/users")), "alice\n");
    assert_eq!(m.ok(WRITER, &format!("ls {view}/users")), "alice\nbob\n");
    m.fails(
        ALICE,
        &format!("cat {view}/users/bob/memories/events/b1/content.md"),
        "Permission denied",
    );
    assert_eq!(
        m.ok(
            ALICE,
            &format!("cat {view}/users/alice/memories/events/a1/content.md")
        ),
        "alice grows tomatoes"
    );
    // A search of the past, from the account: her part only.
    let out = m.ok(ALICE, &format!("cat \"{view}/.search/tomatoes\""));
    assert!(
        out.contains("users/alice/memories/events/a1") && !out.contains("users/bob"),
        "{out}"
    );
    let out = m.ok(WRITER, &format!("cat \"{view}/.search/tomatoes\""));
    assert!(out.contains("users/bob"), "{out}");
    // A restore reaches only her part.
    m.fails(
        ALICE,
        &format!("/bin/echo users > {view}/restore"),
        "Permission denied",
    );
    m.ok(ALICE, &format!("echo users/alice > {view}/restore"));
}

#[test]
fn the_fronts_and_the_inbox_keep_a_user_to_its_own_part() {
    use crate::fronts::{session, tool};
    use serde_json::json;
    let m = Mount::with_args(Some(MEMBERS), &["--embedder", "hash"]);
    m.ok(WRITER, &four_steps(B1, "bob keeps bees", ACTIVE));
    // Bob's inbox is not Alice's to write or read.
    m.fails(
        ALICE,
        "/bin/echo '{\"messages\":[]}' > $M/accounts/acme/users/bob/inbox/planted.json",
        "Permission denied",
    );
    let a = session(
        &m,
        ALICE,
        Some("accounts/acme/users/alice"),
        json!([
            tool(
                "remember",
                json!({"category": "prefs", "slug": "tea", "content": "Alice drinks sencha.\n"})
            ),
            tool(
                "read",
                json!({"path": format!("ctx://{B1}"), "level": "content"})
            ),
            tool(
                "search",
                json!({"query": "who keeps bees", "k": 5, "sync": true})
            ),
            tool(
                "move",
                json!({"from": "memories/prefs/tea", "to": "ctx://acme/users/bob/memories/prefs/tea"})
            ),
        ]),
    );
    assert_eq!(a[0]["error"], false, "{}", a[0]);
    assert_eq!(a[1]["error"], true, "{}", a[1]);
    assert_eq!(a[2]["error"], false, "{}", a[2]);
    assert!(!a[2].to_string().contains("users/bob"), "{}", a[2]);
    assert_eq!(a[3]["error"], true, "{}", a[3]);
    assert_eq!(
        m.ok(WRITER, "ls $M/accounts/acme/users/bob/memories"),
        "events\n"
    );
}
