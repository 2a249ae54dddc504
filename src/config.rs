//! The TOML config (CONTRACT §5) and the tenancy it defines.

use crate::schema::place::check_name;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub account: Vec<AccountConfig>,
    #[serde(default)]
    pub index: IndexSection,
    #[serde(default)]
    pub redaction: RedactionSection,
    #[serde(default)]
    pub store: StoreSection,
    /// `[llm]`: the chat-completions endpoint that extracts memories from
    /// conversations written to an inbox. Without it the inbox refuses writes.
    pub llm: Option<LlmSection>,
    /// `[encryption]`: seal every account's text with keys of its own,
    /// wrapped by this master key.
    pub encryption: Option<EncryptionSection>,
}

/// The `[encryption]` table: where the master key comes from (one of the two).
#[derive(Debug, Deserialize, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EncryptionSection {
    /// A file of 64 hex digits, owner-only.
    pub key_file: Option<std::path::PathBuf>,
    /// A command printing the key in hex (`sh -c`), e.g. a Vault client.
    pub key_command: Option<String>,
}

/// The `[llm]` table.
#[derive(Debug, Deserialize, Clone, Default, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LlmSection {
    /// `http://127.0.0.1:8080/v1` (an OpenAI-compatible server).
    pub url: String,
    pub model: String,
    /// The environment variable holding the API key (sent as a bearer token).
    pub api_key_env: Option<String>,
    /// Seconds one request may take (default 120).
    pub timeout_s: Option<u64>,
    /// Conversations extracted at the same time (default 1).
    pub concurrency: Option<usize>,
    /// Tries of one conversation before it fails (default 4).
    pub max_attempts: Option<u32>,
    /// The first retry's delay; each next one doubles (default 2000).
    pub retry_backoff_ms: Option<u64>,
    /// Completion tokens one request may produce (default 1024).
    pub max_tokens: Option<u32>,
    /// The model's context in tokens (default 8192): a conversation whose
    /// extraction request would not fit is extracted a window of whole
    /// messages at a time.
    pub context_tokens: Option<u32>,
    /// User, agent and category directories get summaries written by the
    /// LLM (default true).
    pub summaries: Option<bool>,
    /// Seconds a directory stays unchanged before its summary is written
    /// again (default 10).
    pub summary_delay_s: Option<u64>,
    /// How memories are written: `"quoted"` (default: the model picks
    /// sentences of the messages, each memory is their words with who said
    /// them and when) or `"written"` (the model writes sentences of its own,
    /// checked against the messages they cite).
    pub memories: Option<String>,
}

/// The `[store]` table: where the namespace lives. Without `url`, the
/// embedded redb store in the data dir.
#[derive(Debug, Deserialize, Clone, Default)]
#[serde(deny_unknown_fields)]
pub struct StoreSection {
    /// `postgres://USER[:PASSWORD]@HOST:PORT/DB`: several daemons, one namespace.
    pub url: Option<String>,
}

/// The `[redaction]` table: secrets replaced at commit (on by default).
#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
pub struct RedactionSection {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Secret keys; when given, they replace the built-in list.
    pub keys: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

impl Default for RedactionSection {
    fn default() -> Self {
        RedactionSection {
            enabled: true,
            keys: None,
        }
    }
}

/// Who gets redaction: the `[redaction]` table and the accounts that turn it off.
#[derive(Debug, Clone, Default)]
pub struct RedactionPolicy {
    pub section: RedactionSection,
    pub off: std::collections::BTreeSet<String>,
}

impl RedactionPolicy {
    /// The redactor for `account`, or `None` when it keeps its secrets.
    pub fn for_account(&self, account: &str) -> Option<crate::schema::redact::Redactor> {
        if !self.section.enabled || self.off.contains(account) {
            return None;
        }
        Some(match &self.section.keys {
            Some(k) => crate::schema::redact::Redactor::new(k.iter().cloned()),
            None => crate::schema::redact::Redactor::default(),
        })
    }
}

/// The `[index]` table: the embedder and the indexer's knobs (all optional).
#[derive(Debug, Deserialize, Default, Clone)]
#[serde(deny_unknown_fields)]
pub struct IndexSection {
    /// `false`: serve the tree without search (events wait in the outbox).
    pub enabled: Option<bool>,
    /// `auto` (MiniLM when its files are there, else hashing), `minilm`, `hash` or `http`.
    pub embedder: Option<String>,
    /// Directory with MiniLM's `config.json`, `tokenizer.json`, `model.safetensors`.
    pub model_dir: Option<PathBuf>,
    /// OpenAI-compatible server (`http://host:port` or its `/v1/embeddings`).
    pub http_url: Option<String>,
    pub http_model: Option<String>,
    pub http_dim: Option<usize>,
    pub http_timeout_ms: Option<u64>,
    pub hash_dim: Option<usize>,
    pub max_retries: Option<u32>,
    pub retry_backoff_ms: Option<u64>,
    pub sync_timeout_s: Option<u64>,
    pub hnsw_m: Option<usize>,
    pub hnsw_ef_construction: Option<usize>,
    pub hnsw_ef_search: Option<usize>,
    /// Weight of the vector channel in hybrid ranking (BM25's is 1), 0..=10.
    pub vector_weight: Option<f32>,
    /// `false`: a conversation's message gets one vector, its own text,
    /// instead of its views too (`index::text::message_views`): about a
    /// fifth of the vectors, and of the recall the views add.
    pub message_views: Option<bool>,
    /// Memory the loaded account indexes may hold, in MiB (an estimate from
    /// their documents and vectors); the least recently used leave past it.
    pub max_loaded_mb: Option<u64>,
}

/// `[account.quota]`: what one account may use (every limit optional).
#[derive(Debug, Deserialize, Default, Clone, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    /// Bytes the account's nodes hold in the store, every version counted.
    pub bytes: Option<u64>,
    /// Commits, deletes and moves per UTC day.
    pub writes_per_day: Option<u64>,
    /// Searches (opens of `.search/` files) per minute.
    pub searches_per_minute: Option<u32>,
    /// Tokens sent to the embedder per UTC day (about 4 bytes of text each).
    pub embed_tokens_per_day: Option<u64>,
    /// Tokens the LLM spends on the account's conversations per UTC day.
    pub llm_tokens_per_day: Option<u64>,
}

/// Everything a config file sets.
#[derive(Debug, Clone)]
pub struct Settings {
    pub tenancy: Tenancy,
    pub index: IndexSection,
    pub redaction: RedactionPolicy,
    /// Quotas by account (accounts without a `[account.quota]` are unlimited).
    pub quotas: BTreeMap<String, Quota>,
    /// `[store] url`: a shared PostgreSQL store instead of the embedded one.
    pub store_url: Option<String>,
    /// `[llm]`: memory extraction from conversations.
    pub llm: Option<LlmSection>,
    /// Accounts whose extracted memories wait for a writer's review.
    pub review: std::collections::BTreeSet<String>,
    /// Paths (under `accounts/`, an account's `unindexed` prefixes) whose
    /// nodes and conversations are never indexed.
    pub unindexed: Vec<String>,
    /// `[encryption]`: where the master key comes from.
    pub encryption: Option<EncryptionSection>,
}

impl Settings {
    /// What every daemon of one shared store must agree on, section by
    /// section, in a canonical text: who may read and write each account,
    /// which accounts are in review, their quotas, what is never indexed,
    /// and redaction. A daemon whose sections differ from those of the
    /// daemons already serving the store refuses to start (SEMANTICS
    /// "Several hosts").
    pub fn shared_sections(&self) -> BTreeMap<String, String> {
        let mut m = BTreeMap::new();
        let tenancy = match &self.tenancy {
            Tenancy::Owner(uid) => format!("owner {uid}"),
            Tenancy::Accounts(a) => a
                .iter()
                .map(|(id, m)| {
                    let (mut w, mut r) = (m.writers.clone(), m.readers.clone());
                    w.sort_unstable();
                    r.sort_unstable();
                    let mut line = format!("{id}: writers {w:?} readers {r:?}");
                    for (uid, s) in &m.scoped {
                        line.push_str(&format!(
                            " {uid} {} writes {:?} reads {:?}",
                            s.own, s.write, s.read
                        ));
                    }
                    line
                })
                .collect::<Vec<_>>()
                .join("; "),
        };
        m.insert("accounts (writers, readers)".into(), tenancy);
        m.insert(
            "review".into(),
            self.review.iter().cloned().collect::<Vec<_>>().join(", "),
        );
        m.insert(
            "quotas".into(),
            self.quotas
                .iter()
                .map(|(a, q)| format!("{a}: {q:?}"))
                .collect::<Vec<_>>()
                .join("; "),
        );
        let mut unindexed = self.unindexed.clone();
        unindexed.sort();
        m.insert("unindexed".into(), unindexed.join(", "));
        let r = &self.redaction;
        m.insert(
            "redaction".into(),
            format!(
                "enabled {} keys {:?} off for {:?}",
                r.section.enabled, r.section.keys, r.off
            ),
        );
        // One daemon indexes for all: the index is the store's. Named only
        // when off, so daemons of builds before the switch still agree.
        if self.index.message_views == Some(false) {
            m.insert("index message_views".into(), "false".into());
        }
        m
    }

    pub fn load(path: &Path) -> anyhow::Result<Settings> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("cannot read config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| anyhow::anyhow!("bad config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Settings> {
        let file: ConfigFile = toml::from_str(text)?;
        let mut map = BTreeMap::new();
        let mut off = std::collections::BTreeSet::new();
        let mut quotas = BTreeMap::new();
        let mut review = std::collections::BTreeSet::new();
        let mut unindexed = Vec::new();
        for a in file.account {
            for p in &a.unindexed {
                let p = p.trim_matches('/');
                for seg in p.split('/') {
                    check_name(seg).map_err(|e| {
                        anyhow::anyhow!("account {:?}: unindexed prefix {p:?}: {e}", a.id)
                    })?;
                }
                unindexed.push(format!("{}/{p}", a.id));
            }
            if a.review {
                review.insert(a.id.clone());
            }
            if let Some(q) = a.quota.clone() {
                quotas.insert(a.id.clone(), q);
            }
            if !a.redact {
                off.insert(a.id.clone());
            }
            check_name(&a.id).map_err(|e| anyhow::anyhow!("account id {:?}: {e}", a.id))?;
            if let Some(uid) = a.writers.iter().find(|u| a.readers.contains(u)) {
                anyhow::bail!("account {:?}: uid {uid} is both writer and reader", a.id);
            }
            let scoped = scoped_members(&a)?;
            let members = Members {
                writers: a.writers,
                readers: a.readers,
                scoped,
            };
            if map.insert(a.id.clone(), members).is_some() {
                anyhow::bail!("account {:?} is listed twice", a.id);
            }
        }
        Ok(Settings {
            tenancy: Tenancy::Accounts(map),
            index: file.index,
            redaction: RedactionPolicy {
                section: file.redaction,
                off,
            },
            quotas,
            store_url: file.store.url,
            llm: file.llm,
            review,
            unindexed,
            encryption: match file.encryption {
                Some(e) if e.key_file.is_some() == e.key_command.is_some() => {
                    anyhow::bail!("[encryption] needs exactly one of key_file and key_command")
                }
                e => e,
            },
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    pub id: String,
    #[serde(default)]
    pub writers: Vec<u32>,
    #[serde(default)]
    pub readers: Vec<u32>,
    /// `false` keeps this account's secrets as written (no redaction).
    #[serde(default = "yes")]
    pub redact: bool,
    /// `true`: memories extracted from this account's conversations wait as
    /// a proposal (`inbox/NAME.review`) until a writer accepts them.
    #[serde(default)]
    pub review: bool,
    /// Paths inside the account (`users/bob/memories/private`) whose nodes
    /// and conversations are never indexed: no text of them reaches an
    /// embedder or the search index.
    #[serde(default)]
    pub unindexed: Vec<String>,
    pub quota: Option<Quota>,
    /// `[[account.user]]`: uids that reach only their own user's memory.
    #[serde(default)]
    pub user: Vec<MemberConfig>,
    /// `[[account.agent]]`: uids that reach only their own agent's memory.
    #[serde(default)]
    pub agent: Vec<MemberConfig>,
}

/// `[[account.user]]` or `[[account.agent]]`: a user's or an agent's own
/// uids. Such a uid reads and writes its own subtree and the account's
/// projects; a user also reads the agents named in `agents`, an agent also
/// reads and writes the users named in `users` (the ones it serves).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberConfig {
    pub id: String,
    #[serde(default)]
    pub uids: Vec<u32>,
    /// (a user) Agents whose memories and skills this user may read.
    #[serde(default)]
    pub agents: Vec<String>,
    /// (an agent) Users whose memories this agent may read and write.
    #[serde(default)]
    pub users: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Access {
    None,
    Read,
    Write,
}

/// Who may use which account.
#[derive(Debug, Clone)]
pub enum Tenancy {
    /// No config: the mounting uid (and root) may do everything, no one else anything.
    Owner(u32),
    /// From a config: accounts and their uids; uid 0 administers all of them.
    Accounts(BTreeMap<String, Members>),
}

/// The uids of one account: its writers and readers (the whole account),
/// and the uids of its users and agents (a part of it each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Members {
    pub writers: Vec<u32>,
    pub readers: Vec<u32>,
    pub scoped: BTreeMap<u32, Scope>,
}

/// What a user's or an agent's uid may reach inside its account: paths
/// relative to the account (`users/alice`, `projects`), each with what
/// lies below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// `users/alice` or `agents/support`: the member this uid is.
    pub own: String,
    pub write: Vec<String>,
    pub read: Vec<String>,
}

/// Is `path` `prefix` or below it?
fn under(path: &str, prefix: &str) -> bool {
    path.strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

impl Scope {
    fn new(kind: &str, m: &MemberConfig) -> Scope {
        let own = format!("{kind}/{}", m.id);
        let mut write = vec![own.clone(), "projects".to_string()];
        let mut read = Vec::new();
        write.extend(m.users.iter().map(|u| format!("users/{u}")));
        read.extend(m.agents.iter().map(|a| format!("agents/{a}")));
        Scope { own, write, read }
    }

    /// What this uid may do at `rel` (a path inside the account, `""` for
    /// the account itself): write below its grants, read below the read
    /// ones, and pass through (read, listings cut to what it may reach)
    /// the directories above them.
    pub fn access(&self, rel: &str) -> Access {
        if self.write.iter().any(|p| under(rel, p)) {
            return Access::Write;
        }
        let reads = self.read.iter().any(|p| under(rel, p));
        let passes = rel.is_empty()
            || rel == "users"
            || rel == "agents"
            || self.write.iter().chain(&self.read).any(|p| under(p, rel));
        if reads || passes {
            Access::Read
        } else {
            Access::None
        }
    }
}

impl Tenancy {
    pub fn parse(text: &str) -> anyhow::Result<Tenancy> {
        Ok(Settings::parse(text)?.tenancy)
    }

    /// Does `uid` have any access at all (an account, the mount's owner, root)?
    pub fn knows(&self, uid: u32) -> bool {
        uid == 0
            || match self {
                Tenancy::Owner(owner) => *owner == uid,
                Tenancy::Accounts(map) => map.values().any(|m| {
                    m.writers.contains(&uid)
                        || m.readers.contains(&uid)
                        || m.scoped.contains_key(&uid)
                }),
            }
    }

    /// What `uid` may do in `account` as a whole: a user's or an agent's
    /// uid reads it (to pass through to its own part; see [`Self::access_at`]).
    pub fn access(&self, uid: u32, account: &str) -> Access {
        self.access_at(uid, account, "")
    }

    /// What `uid` may do at `rel`, a path inside `account` (`""`: the
    /// account itself).
    pub fn access_at(&self, uid: u32, account: &str, rel: &str) -> Access {
        if uid == 0 {
            return Access::Write;
        }
        match self {
            Tenancy::Owner(owner) if *owner == uid => Access::Write,
            Tenancy::Owner(_) => Access::None,
            Tenancy::Accounts(map) => match map.get(account) {
                Some(m) if m.writers.contains(&uid) => Access::Write,
                Some(m) if m.readers.contains(&uid) => Access::Read,
                Some(m) => m.scoped.get(&uid).map_or(Access::None, |s| s.access(rel)),
                None => Access::None,
            },
        }
    }

    /// The part of `account` that `uid` is limited to, when it is a user's
    /// or an agent's uid there.
    pub fn scope(&self, uid: u32, account: &str) -> Option<&Scope> {
        match self {
            Tenancy::Accounts(map) if uid != 0 => map.get(account)?.scoped.get(&uid),
            _ => None,
        }
    }

    /// Has `account` users' or agents' uids (so what a directory above
    /// their parts lists, and whether a user's or an agent's directory may
    /// be entered, depends on the caller)?
    pub fn is_scoped(&self, account: &str) -> bool {
        match self {
            Tenancy::Accounts(map) => map.get(account).is_some_and(|m| !m.scoped.is_empty()),
            Tenancy::Owner(_) => false,
        }
    }

    /// Does the config define `account`? (A map lookup: every lookup of a
    /// directory in an account asks it.)
    pub fn is_configured(&self, account: &str) -> bool {
        match self {
            Tenancy::Owner(_) => false,
            Tenancy::Accounts(map) => map.contains_key(account),
        }
    }

    /// Every uid given any access (the mounting uid's alone without a
    /// config; root administers, and is not listed), each once, ascending.
    pub fn uids(&self) -> Vec<u32> {
        let mut all = std::collections::BTreeSet::new();
        match self {
            Tenancy::Owner(owner) => {
                all.insert(*owner);
            }
            Tenancy::Accounts(map) => {
                for m in map.values() {
                    all.extend(m.writers.iter().chain(&m.readers).copied());
                    all.extend(m.scoped.keys().copied());
                }
            }
        }
        all.into_iter().collect()
    }

    /// Accounts a config defines (they exist without a mkdir).
    pub fn configured(&self) -> Vec<String> {
        match self {
            Tenancy::Owner(_) => Vec::new(),
            Tenancy::Accounts(map) => map.keys().cloned().collect(),
        }
    }
}

/// The users' and agents' uids of one account, each checked: valid names,
/// each member once, each uid in one role of the account only.
fn scoped_members(a: &AccountConfig) -> anyhow::Result<BTreeMap<u32, Scope>> {
    let mut scoped = BTreeMap::new();
    for (kind, list) in [("users", &a.user), ("agents", &a.agent)] {
        let mut seen = std::collections::BTreeSet::new();
        for m in list {
            let what = format!("account {:?}: {kind} {:?}", a.id, m.id);
            check_name(&m.id).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
            if !seen.insert(m.id.as_str()) {
                anyhow::bail!("{what} is listed twice");
            }
            if kind == "users" && !m.users.is_empty() {
                anyhow::bail!(
                    "{what}: `users` is for agents (a user's uids reach only its own memory)"
                );
            }
            if kind == "agents" && !m.agents.is_empty() {
                anyhow::bail!("{what}: `agents` is for users (an agent's uids reach its own memory and its users')");
            }
            for n in m.users.iter().chain(&m.agents) {
                check_name(n).map_err(|e| anyhow::anyhow!("{what}: {n:?}: {e}"))?;
            }
            for uid in &m.uids {
                if *uid == 0 {
                    anyhow::bail!("{what}: uid 0 administers every account and cannot be limited");
                }
                if a.writers.contains(uid) || a.readers.contains(uid) {
                    anyhow::bail!(
                        "{what}: uid {uid} is also a writer or reader of the whole account"
                    );
                }
                if scoped.insert(*uid, Scope::new(kind, m)).is_some() {
                    anyhow::bail!("{what}: uid {uid} belongs to two users or agents");
                }
            }
        }
    }
    Ok(scoped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_access() {
        let t = Tenancy::parse(
            "[[account]]\nid = \"acme\"\nwriters = [1001]\nreaders = [1002]\n\
             [[account]]\nid = \"other\"\nwriters = [1003]\n",
        )
        .unwrap();
        assert_eq!(t.access(1001, "acme"), Access::Write);
        assert_eq!(t.access(1002, "acme"), Access::Read);
        assert_eq!(t.access(1003, "acme"), Access::None);
        assert_eq!(t.access(0, "acme"), Access::Write);
        assert_eq!(t.access(1001, "nobody"), Access::None);
        assert!(t.knows(1002) && t.knows(0) && !t.knows(4242));
        assert_eq!(
            t.configured(),
            vec!["acme".to_string(), "other".to_string()]
        );
    }

    #[test]
    fn refuses_bad_configs() {
        assert!(Tenancy::parse("[[account]]\nid = \"a b\"\n").is_err());
        assert!(Tenancy::parse("[[account]]\nid = \"a\"\nwriters=[1]\nreaders=[1]\n").is_err());
        assert!(Tenancy::parse("[[account]]\nid = \"a\"\n[[account]]\nid = \"a\"\n").is_err());
        assert!(Tenancy::parse("[[account]]\nid = \"a\"\nwritres=[1]\n").is_err());
        assert!(Tenancy::parse("not toml [").is_err());
        assert!(Settings::parse("[[account]]\nid = \"a\"\n[account.quota]\nbytez = 1\n").is_err());
        let s = Settings::parse(
            "[[account]]\nid = \"a\"\n[account.quota]\nbytes = 1000\nsearches_per_minute = 5\n",
        )
        .unwrap();
        assert_eq!(s.quotas["a"].bytes, Some(1000));
        assert_eq!(s.quotas["a"].searches_per_minute, Some(5));
        assert_eq!(s.quotas["a"].writes_per_day, None);
        // The [index] table is parsed here and checked by the index.
        assert!(Settings::parse("[index]\nhnsw_m = 300\n").is_ok());
        assert!(Settings::parse("[index]\nhnsw = 3\n").is_err());
    }

    /// `[index] message_views = false` is one of the settings every daemon
    /// of a shared store must agree on (on, the default, it is not named,
    /// as before the switch).
    #[test]
    fn message_views_off_is_shared() {
        let on = Settings::parse("[[account]]\nid = \"a\"\n").unwrap();
        assert!(!on.shared_sections().contains_key("index message_views"));
        let off = Settings::parse("[index]\nmessage_views = false\n").unwrap();
        assert_eq!(off.shared_sections()["index message_views"], "false");
        assert!(Settings::parse("[index]\nmessage_views = \"no\"\n").is_err());
    }

    #[test]
    fn users_and_agents_reach_their_own_part() {
        let t = Tenancy::parse(
            "[[account]]\nid = \"acme\"\nwriters = [1001]\n\
             [[account.user]]\nid = \"ann\"\nuids = [1201, 1202]\nagents = [\"helper\"]\n\
             [[account.user]]\nid = \"ben\"\nuids = [1203]\n\
             [[account.agent]]\nid = \"helper\"\nuids = [1301]\nusers = [\"ben\"]\n",
        )
        .unwrap();
        let at = |uid, rel| t.access_at(uid, "acme", rel);
        assert_eq!(at(1201, "users/ann/memories/x/y"), Access::Write);
        assert_eq!(at(1202, "users/ann"), Access::Write);
        assert_eq!(at(1201, "users/ben"), Access::None);
        assert_eq!(at(1201, "users/anne"), Access::None);
        assert_eq!(at(1201, "users"), Access::Read);
        assert_eq!(at(1201, ""), Access::Read);
        assert_eq!(at(1201, "agents"), Access::Read);
        assert_eq!(at(1201, "agents/helper/skills/s"), Access::Read);
        assert_eq!(at(1201, "agents/other"), Access::None);
        assert_eq!(at(1201, "projects/p/scratchpad/f"), Access::Write);
        assert_eq!(at(1301, "agents/helper/memories"), Access::Write);
        assert_eq!(at(1301, "users/ben/memories/a/b"), Access::Write);
        assert_eq!(at(1301, "users/ann"), Access::None);
        assert_eq!(at(1001, "users/ann"), Access::Write);
        assert_eq!(t.access(1203, "acme"), Access::Read);
        assert_eq!(t.access(1203, "other"), Access::None);
        assert!(t.knows(1301) && t.is_scoped("acme"));
        assert_eq!(t.scope(1201, "acme").unwrap().own, "users/ann");
        assert!(t.scope(1001, "acme").is_none());
        for bad in [
            "[[account]]\nid=\"a\"\nwriters=[5]\n[[account.user]]\nid=\"u\"\nuids=[5]\n",
            "[[account]]\nid=\"a\"\n[[account.user]]\nid=\"u\"\nuids=[5]\n[[account.agent]]\nid=\"g\"\nuids=[5]\n",
            "[[account]]\nid=\"a\"\n[[account.user]]\nid=\"u\"\nuids=[5]\n[[account.user]]\nid=\"u\"\nuids=[6]\n",
            "[[account]]\nid=\"a\"\n[[account.user]]\nid=\"u/x\"\nuids=[5]\n",
            "[[account]]\nid=\"a\"\n[[account.user]]\nid=\"u\"\nuids=[0]\n",
            "[[account]]\nid=\"a\"\n[[account.user]]\nid=\"u\"\nusers=[\"v\"]\n",
            "[[account]]\nid=\"a\"\n[[account.agent]]\nid=\"g\"\nagents=[\"v\"]\n",
            "[[account]]\nid=\"a\"\n[[account.agent]]\nid=\"g\"\nusers=[\"..\"]\n",
            "[[account]]\nid=\"a\"\n[[account.user]]\nid=\"u\"\nuid=[5]\n",
        ] {
            assert!(Tenancy::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn owner_mode() {
        let t = Tenancy::Owner(1000);
        assert_eq!(t.access(1000, "x"), Access::Write);
        assert_eq!(t.access(0, "x"), Access::Write);
        assert_eq!(t.access(1001, "x"), Access::None);
    }
}
