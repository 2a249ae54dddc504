//! A hostile tenant cannot hurt the others: each test reproduces an attack
//! as another uid would run it (`setpriv`), and checks the rule that stops it.

use crate::harness::*;

const N: &str = "acme/users/alice/memories/work/w1";

/// A `to_uri` in `.relations.json` is a node place of the writer's own
/// account, parsed with the name rules of paths: traversal, empty segments,
/// spaces, fragments and queries are refused at close and nothing is stored.
#[test]
fn relations_cannot_point_out_of_the_account() {
    let m = Mount::with_args(Some(CONFIG), &["--no-index"]);
    m.ok(WRITER, &four_steps(N, "v1", ACTIVE));
    let before = m.ok(READER, &format!("cat $M/accounts/{N}/.relations.json $M/accounts/{N}/.meta.json"));
    let from = format!("ctx://{N}");
    for (i, to) in [
        "ctx://acme/../globex/users/bob/memories/work/w1",
        "ctx://acme/users/alice/memories/work/../../../../../globex/users/bob/memories/work/w1",
        "ctx://acme//globex/users/bob/memories/work/w1",
        "ctx://acme/users/alice/memories/work/w 2",
        "ctx://acme/users/alice/memories/work/w2#frag?k=1",
        "ctx://acme/users/alice/memories/./work/w2",
    ]
    .iter()
    .enumerate()
    {
        let rel = m.shared_file(&format!("rel{i}.json"));
        std::fs::write(
            &rel,
            format!(r#"[{{"from_uri":"{from}","to_uri":"{to}","relation_type":"related_to"}}]"#),
        )
        .unwrap();
        m.fails(
            WRITER,
            &format!(
                "cp {} $M/accounts/{N}/.relations.json && /bin/echo '{ACTIVE}' > $M/accounts/{N}/.meta.json",
                rel.display()
            ),
            "Invalid argument",
        );
        let why = m.ok(WRITER, &format!("cat $M/accounts/{N}/.commit-error"));
        assert!(why.contains("to_uri"), "{to}: {why}");
    }
    // The committed version is untouched, and a good edge still commits.
    assert_eq!(
        m.ok(READER, &format!("cat $M/accounts/{N}/.relations.json $M/accounts/{N}/.meta.json")),
        before
    );
    let good = m.shared_file("good.json");
    std::fs::write(
        &good,
        format!(r#"[{{"from_uri":"{from}","to_uri":"ctx://acme/users/alice/memories/work/w2","relation_type":"related_to"}}]"#),
    )
    .unwrap();
    m.ok(
        WRITER,
        &format!(
            "cp {} $M/accounts/{N}/.relations.json && /bin/echo '{ACTIVE}' > $M/accounts/{N}/.meta.json",
            good.display()
        ),
    );
    assert!(m
        .ok(READER, &format!("cat $M/accounts/{N}/.relations.json"))
        .contains("memories/work/w2"));
    m.umount_and_fsck();
}
