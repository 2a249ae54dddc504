//! One job's extraction: the model's candidates, where each lands (its
//! node, or a near-duplicate), how it meets what is there (create, merge,
//! append, skip), and the batch committed or proposed for review.

use super::jobs::Outcome;
use super::{
    provenance, record_results, ChangeRec, Inbox, Job, State, DUPLICATE_SIMILARITY, MAX_SOURCES,
    SAME_EVENT_SIMILARITY,
};
use crate::core::{Caller, Fs};
use crate::error::{Error, Result};
use crate::extract::{self, llm, policy, prompt, Candidate, Conversation};
use crate::schema::place;
use serde_json::{json, Value};

/// Extract, place, merge and commit (or propose) one conversation.
pub(super) fn extract_job(
    ib: &Inbox,
    inbox: &str,
    job: &mut Job,
    conv: &Conversation,
    spent: &mut llm::Usage,
) -> Outcome {
    let account = place::account_of(inbox).to_string();
    // `{a}/users/{u}/inbox`
    let user = place::split(inbox)[2].to_string();
    let cands = match candidates(ib, job, conv, spent) {
        Ok(c) => c,
        Err(o) => return o,
    };
    job.changes.clear();
    let placed = place_all(cands, &user, conv, job);
    let cx = JobCx {
        ib,
        conv,
        account: &account,
        user: &user,
    };
    let mut lines = Vec::new();
    for (t, c) in policy::combine(placed) {
        match cx.plan(job, spent, &lines, t, c) {
            Ok(Some(line)) => lines.push(line),
            Ok(None) => {}
            Err(o) => return o,
        }
    }
    commit_or_hold(ib, job, &account, lines)
}

/// Where each candidate lands (its target node), or why it is skipped
/// (noted in `job.changes`).
fn place_all(
    cands: Vec<Candidate>,
    user: &str,
    conv: &Conversation,
    job: &mut Job,
) -> Vec<(policy::Target, Candidate)> {
    let mut placed = Vec::new();
    for c in cands {
        let target = match extract::entity_is_the_user(&c, conv) {
            Some(why) => Err(why),
            None => policy::target(&c, user, conv.agent.as_deref(), &job.file),
        };
        match target {
            Ok(t) => placed.push((t, c)),
            Err(why) => job.changes.push(ChangeRec {
                action: "skipped".into(),
                kind: c.kind.as_str().into(),
                path: String::new(),
                uri: String::new(),
                version: None,
                why,
                messages: c.messages,
            }),
        }
    }
    placed
}

/// What one job works in: its inbox, its conversation, whose it is.
struct JobCx<'a> {
    ib: &'a Inbox,
    conv: &'a Conversation,
    account: &'a str,
    user: &'a str,
}

impl JobCx<'_> {
    /// One placed candidate: where it lands, how it meets what is there
    /// ([`policy::step`]), and the batch line that carries it out (`None`:
    /// nothing to write); its change is noted in `job.changes`. `lines`
    /// are the lines planned before it.
    fn plan(
        &self,
        job: &mut Job,
        spent: &mut llm::Usage,
        lines: &[(String, String)],
        mut t: policy::Target,
        c: Candidate,
    ) -> std::result::Result<Option<(String, String)>, Outcome> {
        let (ib, conv, account, style) = (self.ib, self.conv, self.account, self.ib.style);
        // Where it lands: the slug's node, or a near-duplicate's.
        let found = match ib.with_fs(|fs| fs.existing_for(account, &t, &c, style)) {
            None => return Err(Outcome::Retry("the daemon is stopping".into())),
            Some(Err(e)) => return Err(Outcome::Retry(e.to_string())),
            Some(Ok(f)) => f,
        };
        // Only what its messages (or the node it joins) say reaches a memory.
        let known = match &found {
            Existing::Node(_, stored, ..) => Some(policy::body(stored)),
            _ => None,
        };
        let (kind, messages) = (c.kind, c.messages.clone());
        // A quote is its message's own words: nothing to check it against.
        let c = match style {
            extract::Style::Quoted => Some(c),
            extract::Style::Written => extract::faithful(c, conv, known, &mut job.dropped),
        };
        let Some(c) = c else {
            job.changes.push(ChangeRec {
                action: "skipped".into(),
                kind: kind.as_str().into(),
                path: t.node.clone(),
                uri: String::new(),
                version: None,
                why: "no sentence of it is supported by the messages it cites (see dropped)".into(),
                messages,
            });
            return Ok(None);
        };
        let mut change = ChangeRec {
            action: String::new(),
            kind: c.kind.as_str().into(),
            path: t.node.clone(),
            uri: String::new(),
            version: None,
            why: String::new(),
            messages: c.messages.clone(),
        };
        let meets = match &found {
            Existing::None => policy::Meets::Nothing,
            Existing::Same(path, sim, stored) => policy::Meets::Same {
                path,
                sim: *sim,
                stored,
            },
            Existing::Node(path, stored, ..) => policy::Meets::Node {
                path,
                stored,
                taken: lines.iter().any(|(n, _)| n == path),
            },
        };
        let step = policy::step(t.mode, style, c.kind, &c.text, meets);
        // A merge into the node met is planned on its version (0: a node
        // that is not there), so a delete or an edit made meanwhile wins
        // over the job and over a late review; the sources of the text it
        // keeps go with it.
        let (earlier, base) = match (&step, &found) {
            (
                policy::Step::Merged { .. } | policy::Step::AskModel,
                Existing::Node(_, _, sources, version),
            ) => (sources.clone(), *version),
            _ => (Vec::new(), 0),
        };
        // An earlier event this one updates.
        let mut supersedes: Option<String> = None;
        let (content, action, why) = match step {
            policy::Step::New {
                action,
                why,
                supersedes: old,
            } => {
                supersedes = old;
                (
                    Some(policy::content(&c.topic, c.kind, &c.text)),
                    action,
                    why,
                )
            }
            policy::Step::Skip { at, why } => {
                if let Some(at) = at {
                    change.path = at;
                }
                (None, "skipped", why)
            }
            policy::Step::Merged { text, why } => {
                let Existing::Node(node, stored, ..) = &found else {
                    unreachable!("a merge meets a node")
                };
                t.node = node.clone();
                change.path = node.clone();
                let content = policy::content(&title_of(stored, &c.topic), c.kind, &text);
                (Some(content), "merged", why)
            }
            policy::Step::AskModel => {
                let Existing::Node(node, stored, ..) = &found else {
                    unreachable!("a merge meets a node")
                };
                let dup = *node != t.node;
                t.node = node.clone();
                change.path = node.clone();
                // The day's budget holds within a job too: a merge-heavy
                // conversation stops at it and waits for the next day.
                if let Some(why) = ib
                    .with_fs(|fs| fs.llm_budget_spent(account, spent.total()))
                    .flatten()
                {
                    return Err(Outcome::Wait(why));
                }
                merge_by_model(ib, &c, conv, stored, dup, spent)?
            }
        };
        change.action = action.into();
        change.why = why;
        change.uri = place::uri_of(&format!("{account}/{}", change.path));
        let line = content.map(|content| {
            let w = Write {
                node: &t.node,
                content,
                merged: action == "merged",
                why: &change.why,
                earlier,
                base,
                supersedes,
            };
            (
                t.node.clone(),
                batch_line(account, self.user, &job.file, conv, &c, w),
            )
        });
        job.changes.push(change);
        Ok(line)
    }
}

/// The model's candidates for `conv`, a window of whole messages at a
/// time; what it quoted of nothing is noted in `job.dropped`.
fn candidates(
    ib: &Inbox,
    job: &mut Job,
    conv: &Conversation,
    spent: &mut llm::Usage,
) -> std::result::Result<Vec<Candidate>, Outcome> {
    let style = ib.style;
    let schema = style.schema(conv.messages.len());
    // A conversation longer than the model's context is extracted a window
    // of whole messages at a time, never cut.
    let answer_room = ib.client.max_tokens() as usize;
    let windows = match prompt::windows(conv, ib.context_tokens, answer_room, style.overhead()) {
        Ok(w) => w,
        Err(e) => return Err(Outcome::Fail(e)),
    };
    job.windows = windows.len();
    let mut cands = Vec::new();
    job.dropped.clear();
    let stop = style.stop();
    let ask = |req: Vec<serde_json::Value>, spent: &mut llm::Usage| {
        match stop {
            Some(stop) => ib.client.chat_json_until(req, &schema, &stop, spent),
            None => ib.client.chat_json(req, &schema, spent),
        }
        .map_err(failed)
    };
    for w in windows {
        // An answer cut at max_tokens is followed by a request for the
        // messages after the last one it quoted, a few times at most.
        let mut from = w.start;
        for asked in 0..=MAX_RESUMES {
            let range = from..w.end;
            let mut answer = ask(style.request(conv, range.clone()), spent)?;
            // An answer that quoted nothing of these messages (a small model
            // copying the worked example) is asked again, once, without it.
            if let Some(again) = style.request_again(&answer, conv, range.clone()) {
                job.dropped.push(format!(
                    "messages {}..{}: the model's answer quoted none of them; asked again without the example",
                    range.start, range.end
                ));
                answer = ask(again, spent)?;
            }
            let got = match style.candidates(&answer, conv, range.clone(), &cands) {
                Ok(x) => x,
                Err(e) => return Err(Outcome::Retry(e)),
            };
            for c in got.found {
                // Picked again by a later request of the window.
                if !cands.iter().any(|o: &Candidate| o.text == c.text) {
                    cands.push(c);
                }
            }
            job.dropped.extend(got.dropped);
            let Some(next) = got.resume else { break };
            let again = if asked < MAX_RESUMES {
                "asked for them again"
            } else {
                "not asked again (the window's requests are used up)"
            };
            job.dropped.push(format!(
                "messages {next}..{}: the answer for {}..{} was cut before them; {again}",
                range.end, range.start, range.end
            ));
            from = next;
        }
    }
    Ok(cands)
}

/// Requests for the rest of a window after the first, at most (each
/// begins past the last message the one before quoted).
const MAX_RESUMES: usize = 3;

/// What a candidate writes: its node, content, and what the line of the
/// batch says of where it comes from.
struct Write<'a> {
    node: &'a str,
    content: String,
    merged: bool,
    why: &'a str,
    /// The sources of the text a merge keeps.
    earlier: Vec<Value>,
    /// The version the change is planned on (0: a node that is not there).
    base: u32,
    /// An earlier event this one updates.
    supersedes: Option<String>,
}

/// The batch line of candidate `c` of `user`'s conversation `file`: its
/// content with the meta that says where it comes from and when, over the
/// version it was planned on.
fn batch_line(
    account: &str,
    user: &str,
    file: &str,
    conv: &Conversation,
    c: &Candidate,
    w: Write,
) -> String {
    let here = provenance(user, file, conv, &c.messages);
    let mut meta = json!({
        "status": "ACTIVE",
        "source": "extraction",
        "kind": c.kind.as_str(),
        "provenance": here,
    });
    // When it became known (the newest message it cites), and for
    // an event or case when it happened (the date its text names).
    let said = extract::when::said_on(conv, &c.messages);
    if let Some(d) = said {
        meta["valid_from"] = json!(d.to_string());
    }
    if matches!(c.kind, extract::Kind::Event | extract::Kind::Case) {
        if let Some(d) = extract::when::first_date(&c.text).or(said) {
            meta["happened"] = json!(d.to_string());
        }
    }
    if w.merged {
        // What this version changed, in the model's words.
        meta["changed"] = json!(w.why);
    }
    if !w.earlier.is_empty() {
        // Every conversation the merged text holds facts of, newest first.
        let mut all = vec![meta["provenance"].clone()];
        all.extend(w.earlier.into_iter().take(MAX_SOURCES - 1));
        meta["sources"] = Value::Array(all);
    }
    let mut line =
        json!({"node": w.node, "content": w.content, "meta": meta, "if_version": w.base});
    if let Some(old) = &w.supersedes {
        line["relations"] = json!([{
            "from_uri": place::uri_of(&format!("{account}/{}", w.node)),
            "to_uri": place::uri_of(&format!("{account}/{old}")),
            "relation_type": crate::schema::names::SUPERSEDES,
            "reason": w.why,
        }]);
    }
    line.to_string()
}

/// Commit the batch `lines` (or propose it, with review on), holding
/// what would instruct the agent for a writer.
fn commit_or_hold(
    ib: &Inbox,
    job: &mut Job,
    account: &str,
    lines: Vec<(String, String)>,
) -> Outcome {
    if ib.review.contains(account) {
        job.proposal = lines.into_iter().map(|(_, l)| l).collect();
        job.state = State::Review;
        return Outcome::Finished;
    }
    // What a conversation would make an instruction to the agent (a skill,
    // a pattern) waits for a writer, whatever the account's review mode:
    // a message such as "SYSTEM OVERRIDE: …" must not become a procedure
    // an agent follows (docs/HOSTILE.md, "Memory poisoning").
    let (held, now): (Vec<_>, Vec<_>) = lines
        .into_iter()
        .partition(|(node, _)| policy::instructs_agent(node));
    for ch in job
        .changes
        .iter_mut()
        .filter(|c| c.action != "skipped" && policy::instructs_agent(&c.path))
    {
        ch.why = format!(
            "held for review: an instruction to the agent, taken from a conversation, \
             is committed only when a writer accepts it ({})",
            ch.why
        );
    }
    job.proposal = now.into_iter().map(|(_, l)| l).collect();
    let caller = Caller {
        uid: job.uid,
        gid: job.gid,
        pid: 0,
    };
    let proposal = std::mem::take(&mut job.proposal);
    if !proposal.is_empty() {
        let r = ib.with_fs(|fs| {
            fs.commit_batch(caller, account, proposal.join("\n").as_bytes(), "inbox")
        });
        match r {
            None => return Outcome::Retry("the daemon is stopping".into()),
            Some(Err(e @ (Error::AccessDenied | Error::ReadOnly))) => {
                return Outcome::Fail(format!(
                    "the conversation's writer may no longer write: {e}"
                ))
            }
            Some(Err(e)) => return Outcome::Retry(e.to_string()),
            Some(Ok((result, _))) => record_results(job, &result),
        }
    }
    if !held.is_empty() {
        job.proposal = held.into_iter().map(|(_, l)| l).collect();
        job.state = State::Review;
        return Outcome::Finished;
    }
    job.state = State::Done;
    Outcome::Finished
}

/// The model merges candidate `c` into the node whose `content.md` is
/// `stored` (`dup`: a near-duplicate, not the target itself): the new
/// content, `merged` or `skipped`, and why. Each sentence of the merged
/// text must come from the cited messages or the version it replaces.
fn merge_by_model(
    ib: &Inbox,
    c: &Candidate,
    conv: &Conversation,
    stored: &str,
    dup: bool,
    spent: &mut llm::Usage,
) -> std::result::Result<(Option<String>, &'static str, String), Outcome> {
    let old = policy::body(stored).to_string();
    let v = ib
        .client
        .chat_json(
            prompt::merge_messages(&old, &c.text),
            &prompt::merge_schema(),
            spent,
        )
        .map_err(failed)?;
    let text = v["text"].as_str().unwrap_or("").trim().to_string();
    let changed = v["changed"].as_str().unwrap_or("").trim().to_string();
    let refused = extract::sources(c, conv, Some(&old))
        .split(&text)
        .1
        .into_iter()
        .next();
    Ok(if let Some((s, why)) = refused {
        (
            None,
            "skipped",
            format!(
                "merge refused: the model wrote {} ({why}), which neither the messages it \
                 cites nor the version it replaces say",
                crate::schema::excerpt(&s)
            ),
        )
    } else if text.is_empty() || prompt::same_text(&text, &old) {
        (
            None,
            "skipped",
            format!("already known: {}", crate::schema::excerpt(&old)),
        )
    } else {
        (
            Some(policy::content(&title_of(stored, &c.topic), c.kind, &text)),
            "merged",
            if dup {
                format!("near-duplicate of this memory; {changed}")
            } else {
                changed
            },
        )
    })
}

/// What a failed model call makes of a try: retried later when the
/// failure may pass, failed now when it cannot.
fn failed(e: llm::LlmError) -> Outcome {
    match e {
        llm::LlmError::Transient(e) => Outcome::Retry(e),
        llm::LlmError::Permanent(e) => Outcome::Fail(e),
    }
}

/// The `# title` of a stored `content.md`, or `topic` when it has none.
fn title_of(stored: &str, topic: &str) -> String {
    stored
        .strip_prefix("# ")
        .and_then(|r| r.split_once('\n'))
        .map(|(t, _)| t.to_string())
        .unwrap_or_else(|| topic.to_string())
}

/// What a candidate meets at its place.
enum Existing {
    None,
    /// The node to merge into (the target's, or a near-duplicate found by
    /// search), its `content.md`, the sources of its text and its version.
    Node(String, String, Vec<Value>, u32),
    /// For appends: the same event or case is already there (path,
    /// similarity, its `content.md`).
    Same(String, f32, String),
}

impl Fs {
    /// The committed ACTIVE node at `node` (under the account): its
    /// content and the sources of its text (`sources` of its `.meta.json`,
    /// or its `provenance` alone).
    fn active_content(
        &self,
        account: &str,
        node: &str,
    ) -> Result<Option<(String, Vec<Value>, u32)>> {
        let path = format!("{account}/{node}");
        let Some(rec) = self.store.get_node(&path)? else {
            return Ok(None);
        };
        if rec.status != crate::store::Status::Active || self.expired(&path) {
            return Ok(None);
        }
        let read = |name: &str| -> Result<String> {
            Ok(self
                .store
                .read_file(&rec, name)?
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default())
        };
        let meta: Value = serde_json::from_str(&read(place::META)?).unwrap_or_default();
        let sources = match (&meta["sources"], &meta["provenance"]) {
            (Value::Array(a), _) => a.clone(),
            (_, p @ Value::Object(_)) => vec![p.clone()],
            _ => Vec::new(),
        };
        Ok(Some((read(place::CONTENT)?, sources, rec.version)))
    }

    /// What candidate `c`, placed at `t`, meets: the node at its place, or
    /// the most similar memory of its category when that is close enough.
    /// Memories are compared by what tells them apart in their `style`.
    fn existing_for(
        &self,
        account: &str,
        t: &policy::Target,
        c: &Candidate,
        style: extract::Style,
    ) -> Result<Existing> {
        let words = |text: &str| style.comparable(text);
        if t.mode == policy::Mode::Merge {
            if let Some((content, sources, v)) = self.active_content(account, &t.node)? {
                return Ok(Existing::Node(t.node.clone(), content, sources, v));
            }
        }
        if t.node == t.category_dir {
            return Ok(Existing::None);
        }
        let Some(ix) = self.index() else {
            return Ok(Existing::None);
        };
        let scope = format!("{account}/{}", t.category_dir);
        let q = crate::index::Query {
            text: words(&c.text),
            k: 3,
            mode: crate::index::Mode::Vector,
            expand: false,
            tenant: None,
        };
        // A category nobody wrote yet, or a graph still loading: nothing to compare.
        let hits = match ix.search(&scope, &q) {
            Ok(h) => h,
            Err(Error::Unavailable(_)) | Err(Error::NotFound) => return Ok(Existing::None),
            Err(e) => return Err(e),
        };
        for h in hits {
            let sim = h.vector_score.unwrap_or(0.0);
            let Some(node) = h.path.strip_prefix(&format!("accounts/{account}/")) else {
                continue;
            };
            // Only siblings: a node of the same category directory.
            if node.rsplit_once('/').map(|(d, _)| d) != Some(t.category_dir.as_str()) {
                continue;
            }
            match t.mode {
                policy::Mode::Append if sim >= SAME_EVENT_SIMILARITY => {
                    if let Some((content, ..)) = self.active_content(account, node)? {
                        return Ok(Existing::Same(node.to_string(), sim, content));
                    }
                }
                policy::Mode::Merge if sim >= DUPLICATE_SIMILARITY => {
                    if let Some((content, sources, v)) = self.active_content(account, node)? {
                        // Sentences about the user are alike to a small
                        // embedder whatever they say: a near-duplicate must
                        // also share a word that carries the subject.
                        if policy::share_subject(&words(&c.text), &words(&content)) {
                            return Ok(Existing::Node(node.to_string(), content, sources, v));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(Existing::None)
    }
}
