//! The redaction of secrets at commit: key/value pairs whose key names a
//! secret and credential shapes found anywhere are replaced before anything
//! is checked, stored or indexed. Pure functions over text and JSON.

use regex::{Captures, Regex};
use serde_json::Value;
use std::sync::OnceLock;

/// What replaces a secret.
pub const REDACTED: &str = "[REDACTED]";

/// Keys whose values are secrets unless the config says otherwise.
pub const DEFAULT_SECRET_KEYS: &[&str] = &[
    "api_key",
    "apikey",
    "token",
    "secret",
    "password",
    "passwd",
    "pwd",
    "passphrase",
    "private_key",
    "access_key",
    "secret_key",
    "client_secret",
    "auth",
    "authorization",
    "credential",
    "credentials",
    "session_key",
    "cookie",
];

/// Replaces secrets with `[REDACTED]`.
#[derive(Debug, Clone)]
pub struct Redactor {
    keys: Vec<String>,
}

impl Default for Redactor {
    fn default() -> Self {
        Redactor::new(DEFAULT_SECRET_KEYS.iter().map(|s| s.to_string()))
    }
}

/// Credential shapes that are secrets wherever they appear.
fn shapes() -> &'static [(Regex, &'static str)] {
    static S: OnceLock<Vec<(Regex, &'static str)>> = OnceLock::new();
    S.get_or_init(|| {
        [
            (
                r"-----BEGIN ([A-Z0-9 ]+ )?PRIVATE KEY-----[\s\S]*?-----END ([A-Z0-9 ]+ )?PRIVATE KEY-----",
                "[REDACTED PRIVATE KEY]",
            ),
            (r"(?i)\bbearer\s+[A-Za-z0-9\-._~+/]{12,}=*", "Bearer [REDACTED]"),
            (r"(?i)\bbasic\s+[A-Za-z0-9+/]{12,}=*", "Basic [REDACTED]"),
            (r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b", REDACTED),
            (r"\bgh[pousr]_[A-Za-z0-9]{30,}\b", REDACTED),
            (r"\bgithub_pat_[A-Za-z0-9_]{22,}\b", REDACTED),
            (r"\bsk-[A-Za-z0-9_\-]{20,}", REDACTED),
            (r"\bxox[abprs]-[A-Za-z0-9\-]{10,}", REDACTED),
            (r"\bAIza[0-9A-Za-z_\-]{35}\b", REDACTED),
            (
                r"\beyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}",
                REDACTED,
            ),
        ]
        .into_iter()
        .map(|(p, r)| (Regex::new(p).expect("valid pattern"), r))
        .collect()
    })
}

/// `key: value`, `key=value`, `"key": "value"` (the key's quotes are captured).
fn key_value() -> &'static Regex {
    static R: OnceLock<Regex> = OnceLock::new();
    R.get_or_init(|| {
        Regex::new(
            r#"(?P<q>["']?)(?P<key>[A-Za-z][A-Za-z0-9_\-]{0,63})["']?[ \t]*(?P<sep>[:=])[ \t]*(?P<v>"(?:[^"\\\n]|\\.)*"|'[^'\n]*'|\[REDACTED[^\]\n]*\]|[^\s,;}\]\)]+)"#,
        )
        .expect("valid pattern")
    })
}

impl Redactor {
    pub fn new(keys: impl IntoIterator<Item = String>) -> Redactor {
        Redactor {
            keys: keys.into_iter().map(|k| norm_key(&k)).collect(),
        }
    }

    /// Is `key` (any case, `-` or `_`) one of the secret keys, or does it end
    /// in `_KEY` for one of them (`github_token`, `db_password`)?
    pub fn is_secret_key(&self, key: &str) -> bool {
        let k = norm_key(key);
        self.keys.iter().any(|s| {
            k == *s
                || (k.len() > s.len() + 1
                    && k.ends_with(s.as_str())
                    && k.as_bytes()[k.len() - s.len() - 1] == b'_')
        })
    }

    /// `text` with secrets replaced, and how many values were replaced.
    pub fn redact_text(&self, text: &str) -> (String, usize) {
        let mut n = 0;
        let mut out = text.to_string();
        for (re, rep) in shapes() {
            if re.is_match(&out) {
                out = re
                    .replace_all(&out, |_: &Captures| {
                        n += 1;
                        rep.to_string()
                    })
                    .into_owned();
            }
        }
        let kv = key_value();
        if kv.is_match(&out) {
            out = kv
                .replace_all(&out, |c: &Captures| {
                    let whole = c[0].to_string();
                    let v = &c["v"];
                    let inner = v.trim_matches(|ch| ch == '"' || ch == '\'');
                    if !self.is_secret_key(&c["key"])
                        || inner.is_empty()
                        || inner.contains(REDACTED)
                        || inner.eq_ignore_ascii_case("bearer")
                        || inner.eq_ignore_ascii_case("basic")
                    {
                        return whole;
                    }
                    n += 1;
                    let head = &whole[..whole.len() - v.len()];
                    if v.starts_with('"') || (!c["q"].is_empty() && c["sep"].eq(":")) {
                        // JSON stays JSON: a quoted replacement.
                        format!("{head}\"{REDACTED}\"")
                    } else if v.starts_with('\'') {
                        format!("{head}'{REDACTED}'")
                    } else {
                        format!("{head}{REDACTED}")
                    }
                })
                .into_owned();
        }
        (out, n)
    }

    /// Redact a JSON value in place: values of secret keys, and credential
    /// shapes inside strings. Returns how many values were replaced.
    pub fn redact_json(&self, v: &mut Value) -> usize {
        match v {
            Value::Object(o) => {
                let mut n = 0;
                for (k, x) in o.iter_mut() {
                    let secret = self.is_secret_key(k)
                        && !matches!(x, Value::Null | Value::Object(_) | Value::Array(_))
                        && x.as_str() != Some(REDACTED)
                        && x.as_str() != Some("");
                    if secret {
                        *x = Value::String(REDACTED.into());
                        n += 1;
                    } else {
                        n += self.redact_json(x);
                    }
                }
                n
            }
            Value::Array(a) => a.iter_mut().map(|x| self.redact_json(x)).sum(),
            Value::String(s) => {
                let (r, n) = self.redact_text(s);
                if n > 0 {
                    *s = r;
                }
                n
            }
            _ => 0,
        }
    }
}

fn norm_key(k: &str) -> String {
    k.to_ascii_lowercase().replace('-', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction() {
        let r = Redactor::default();
        let (t, n) = r.redact_text("api_key: abc123\nmax_tokens: 500\nGITHUB_TOKEN=ghx\n");
        assert_eq!(
            t,
            "api_key: [REDACTED]\nmax_tokens: 500\nGITHUB_TOKEN=[REDACTED]\n"
        );
        assert_eq!(n, 2);
        let (t, n) = r.redact_text(r#"{"password": "hunter2", "user": "bob", "pin_token": 1234}"#);
        assert_eq!(
            t,
            r#"{"password": "[REDACTED]", "user": "bob", "pin_token": "[REDACTED]"}"#
        );
        assert_eq!(n, 2);
        serde_json::from_str::<Value>(&t).unwrap();
        let (t, n) = r.redact_text("curl -H 'Authorization: Bearer abcdefghijklmnop1234' x");
        assert_eq!(t, "curl -H 'Authorization: Bearer [REDACTED]' x");
        assert_eq!(n, 1);
        let (t, _) = r.redact_text("key AKIAABCDEFGHIJKLMNOP and sk-abcdefghijklmnopqrstuvwx");
        assert_eq!(t, "key [REDACTED] and [REDACTED]");
        let pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIE\nabc\n-----END RSA PRIVATE KEY-----";
        assert_eq!(r.redact_text(pem).0, "[REDACTED PRIVATE KEY]");
        let (t, n) = r.redact_text("The password policy is strict. Tokens: 1500 used.");
        assert_eq!(
            (t.as_str(), n),
            ("The password policy is strict. Tokens: 1500 used.", 0)
        );
        // Idempotent.
        let once = r.redact_text("secret = s3cr3t").0;
        assert_eq!(r.redact_text(&once), (once.clone(), 0));
        let mut v: Value = serde_json::json!({"a": {"client_secret": "x", "n": 1}, "l": ["Bearer abcdefghijklmnop"]});
        assert_eq!(r.redact_json(&mut v), 2);
        assert_eq!(v["a"]["client_secret"], REDACTED);
        let custom = Redactor::new(["ssn".to_string()]);
        assert_eq!(custom.redact_text("ssn: 123-45-6789").1, 1);
        assert_eq!(custom.redact_text("password: x").1, 0);
    }
}
