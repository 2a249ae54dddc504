//! Search through the mount for the fronts: `DIR/.search/QUERY` in the
//! scope, or in every account the caller may read merged by score, with
//! the query fitted to a file name and an optional budget.

use super::{slash, Front, FrontError, FrontResult};
use crate::schema::names::SEARCH_DIR;
use serde_json::{json, Value};

impl Front {
    /// Ranked hits for `query` in the scope (or `dir` inside it): the JSON
    /// of `DIR/.search/QUERY?k=K&format=json`.
    /// With `sync`, first wait until everything committed is searchable
    /// (`MOUNT/.ctxfs/sync`).
    pub fn search(
        &self,
        query: &str,
        k: usize,
        dir: Option<&str>,
        sync: bool,
        budget: Option<usize>,
    ) -> FrontResult<Value> {
        let dir = self.rel(dir.unwrap_or(""))?;
        if sync {
            self.read_text(".ctxfs/sync")?;
        }
        // A file name holds no '/' or NUL; '?' starts the options.
        let q: String = query
            .chars()
            .map(|c| {
                if c == '/' || c == '?' || c == '\0' || c == '\n' {
                    ' '
                } else {
                    c
                }
            })
            .collect();
        let q = q.trim();
        if q.is_empty() {
            return Err(FrontError::invalid("the query is empty"));
        }
        let k = k.clamp(1, 100);
        let above = dir.is_empty() || dir == "accounts";
        let accounts = if above {
            self.readable_accounts()?
        } else {
            Vec::new()
        };
        // Above the accounts, each account's answer packs into its share.
        let budget = budget.map(|b| if above { b / accounts.len().max(1) } else { b });
        if let Some(b) = budget {
            if b < crate::schema::budget::MIN_BUDGET {
                return Err(FrontError::invalid(format!(
                    "a budget gives each account searched at least {} tokens (here {b}): \
                     give a larger budget, or a path to search in",
                    crate::schema::budget::MIN_BUDGET
                )));
            }
        }
        let opts = match budget {
            Some(b) => format!("?k={k}&format=json&budget={b}"),
            None => format!("?k={k}&format=json"),
        };
        // A query is a file name (at most 255 bytes with its options): a
        // longer one is searched by its first words, and the answer says so.
        let (q, cut) = crate::schema::fit_name(q, 255 - opts.len());
        let name = format!("{q}{opts}");
        let one = |dir: &str| -> FrontResult<Value> {
            let rel = format!("{}{SEARCH_DIR}/{name}", slash(dir));
            let text = self.read_text(&rel)?;
            let mut v: Value = serde_json::from_str(&text)
                .map_err(|e| FrontError::invalid(format!("search answered with no JSON: {e}")))?;
            if cut {
                v["query_cut_to"] = q.into();
            }
            Ok(v)
        };
        if !above {
            return one(&dir);
        }
        // Above the accounts (no scope): every account the caller may read,
        // merged by score.
        let mut out = Value::Null;
        let mut results: Vec<Value> = Vec::new();
        let mut packed = String::new();
        for a in &accounts {
            let mut v = one(a)?;
            if let Some(Value::Array(r)) = v.get_mut("results").map(Value::take) {
                results.extend(r);
            }
            if let Some(p) = v["packed"].as_str() {
                packed.push_str(p);
            }
            if out.is_null() {
                out = v;
            }
        }
        if budget.is_some() {
            out["packed"] = packed.into();
        }
        results.sort_by(|a, b| {
            let s = |v: &Value| v["score"].as_f64().unwrap_or(0.0);
            s(b).total_cmp(&s(a))
        });
        let more = results.len() > k || out["more"].as_bool().unwrap_or(false);
        results.truncate(k);
        for (i, r) in results.iter_mut().enumerate() {
            r["rank"] = (i + 1).into();
        }
        out["scope"] = "accounts".into();
        out["accounts"] = json!(accounts);
        out["more"] = more.into();
        out["results"] = Value::Array(results);
        Ok(out)
    }

    /// The accounts the caller may read, `accounts/A`, sorted.
    fn readable_accounts(&self) -> FrontResult<Vec<String>> {
        let mut accounts: Vec<String> = std::fs::read_dir(self.abs("accounts"))
            .map_err(|e| FrontError::io("listing accounts", &e, None))?
            .filter_map(|e| e.ok())
            .map(|e| format!("accounts/{}", e.file_name().to_string_lossy()))
            .collect();
        accounts.sort();
        if accounts.is_empty() {
            return Err(FrontError::invalid(
                "this uid may read no account: there is nothing to search \
                 (give a scope such as accounts/A/users/U, as a uid listed in the config)",
            ));
        }
        Ok(accounts)
    }
}
