//! The names of the store's counters and high-water marks, formatted in one
//! place: usage and node counts are changed in the same transaction as what
//! they count, by several layers (core, index, store, fsck).

use super::Status;

/// Live nodes of an account by status.
pub fn nodes_key(account: &str, status: Status) -> String {
    format!("nodes:{account}:{}", status.as_str())
}

/// Pending outbox events of an account.
pub fn outbox_key(account: &str) -> String {
    format!("outbox:{account}")
}

/// Dead letters of an account.
pub fn dlq_key(account: &str) -> String {
    format!("dlq:{account}")
}

/// Stored bytes of an account (every version's blobs, each once).
pub fn bytes_key(account: &str) -> String {
    format!("bytes:{account}")
}

/// Bytes of the conversations stored in an account's inboxes (they count
/// in its byte quota with its nodes).
pub fn inbox_bytes_key(account: &str) -> String {
    format!("inbox_bytes:{account}")
}

/// Lines of an account's audit trail written before it had shares.
pub fn audit_key(account: &str) -> String {
    format!("audit:{account}")
}

/// Lines of one share of an account's audit trail (`share`: its row name).
pub fn audit_share_key(account: &str, share: &str) -> String {
    format!("audit:{account}:{share}")
}

/// Commits of an account on UTC day `day`.
pub fn writes_key(account: &str, day: u64) -> String {
    format!("writes:{account}:{day}")
}

/// Searches of an account in UTC minute `minute` (minutes since the
/// epoch), counted in the store when several daemons share it.
pub fn searches_key(account: &str, minute: u64) -> String {
    format!("searches:{account}:{minute}")
}

/// The prefix of every `searches_key`.
pub const SEARCHES_PREFIX: &str = "searches:";

/// Embedding tokens spent by an account on UTC day `day`.
pub fn tokens_key(account: &str, day: u64) -> String {
    format!("embed_tokens:{account}:{day}")
}

/// LLM tokens spent on an account's conversations on UTC day `day`.
pub fn llm_tokens_key(account: &str, day: u64) -> String {
    format!("llm_tokens:{account}:{day}")
}

/// Counters of one day only (not recounted by fsck).
pub fn is_daily(key: &str) -> bool {
    key.starts_with("writes:") || key.starts_with("embed_tokens:") || key.starts_with("llm_tokens:")
}

/// High-water mark of an account's graph labels.
pub fn label_key(account: &str) -> String {
    format!("label:{account}")
}

/// High-water marks of ids handed out.
pub const NODE_ID: &str = "node";
pub const BLOB_ID: &str = "blob";
pub const EVENT_ID: &str = "event";
/// Set once every account's stored bytes have been counted.
pub const BYTES_COUNTED: &str = "bytes_counted";
/// Set once the conversations stored in inboxes are counted in quotas.
pub const INBOX_BYTES_COUNTED: &str = "inbox_bytes_counted";

/// Tokens an embedding of `text` costs, by the documented estimate
/// (4 bytes of UTF-8 per token, at least 1).
pub fn tokens_of(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_tokens() {
        assert_eq!(nodes_key("acme", Status::Archived), "nodes:acme:ARCHIVED");
        assert_eq!(writes_key("acme", 3), "writes:acme:3");
        assert!(is_daily(&tokens_key("acme", 3)) && !is_daily(&bytes_key("acme")));
        assert_eq!(tokens_of(""), 1);
        assert_eq!(tokens_of("abcd"), 1);
        assert_eq!(tokens_of("abcde"), 2);
    }
}
