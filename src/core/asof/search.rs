//! `.as-of/T/DIR/.search/QUERY`: the versions current at T, ranked as the
//! live search ranks now, through an exact index of the view kept while
//! it is searched (`index::past`).

use super::Past;
use super::View;
use crate::config::Access;
use crate::core::{Caller, Fs};
use crate::error::{Error, Result};
use crate::index::{PastDoc, PastIndex, Query};
use crate::schema::place;
use crate::store::Status;
use std::sync::Arc;
use std::time::Instant;

impl Fs {
    /// The exact index of the ACTIVE versions `view` shows, built on its
    /// account's first search at that time and kept.
    fn past_index_of(&self, view: &View, ix: &crate::index::Index) -> Result<Arc<PastIndex>> {
        if let Some(px) = self.as_of.past_index(&view.account, view.at) {
            return Ok(px);
        }
        let mut docs = Vec::with_capacity(view.nodes.len());
        for (then, placed) in &view.nodes {
            let Some(rec) = self.placed_rec(placed, Access::Read)? else {
                continue;
            };
            if rec.status != Status::Active || self.services.is_unindexed(then) {
                continue;
            }
            let (texts, _) = crate::index::node_texts(self.store.as_ref(), &rec)?;
            docs.push(PastDoc {
                path: Arc::from(then.as_str()),
                texts,
                content_blob: rec.file(place::CONTENT).map(|f| f.blob),
            });
        }
        let px = Arc::new(ix.past_index(docs)?);
        tracing::debug!(
            account = view.account,
            at = view.at as i64,
            docs = px.len(),
            lexical_only = px.unembedded,
            "past index built"
        );
        self.as_of
            .keep_past_index(&view.account, view.at, px.clone());
        Ok(px)
    }

    /// `.as-of/T/DIR/.search/QUERY`: the versions current at T under DIR,
    /// ranked as the live search ranks (see `index::past`).
    pub(in crate::core) fn as_of_search_file(&self, c: Caller, past: &Past) -> Result<Vec<u8>> {
        let Past::Search {
            time,
            at,
            dir,
            name,
        } = past
        else {
            return Err(Error::NotFound);
        };
        let name = name.as_deref().ok_or(Error::IsDir)?;
        let account = place::account_of(dir);
        let access = self.gate(c, dir, false)?;
        let qn = crate::core::search::parse_query_name(name)?;
        if qn.budget.is_some()
            || qn.since.is_some()
            || qn.until.is_some()
            || qn.expand
            || qn.mode == crate::index::Mode::Tree
        {
            return Err(Error::Invalid(
                "a search of the past takes k, mode (hybrid, vector or lexical) and format=json; \
                 budget, since, until, expand and mode=tree are for the live tree"
                    .into(),
            ));
        }
        self.check_search_rate(account)?;
        let ix = self
            .index()
            .ok_or_else(|| Error::Unavailable("search is off on this mount".into()))?
            .clone();
        let t = Instant::now();
        let view = self.as_of_view(account, *at)?;
        let px = self.past_index_of(&view, &ix)?;
        let q = Query {
            text: qn.text.clone(),
            // More than asked: what this caller may not read, or what was
            // deleted or redacted since, is dropped below.
            k: (qn.k + 1) * 2,
            mode: qn.mode,
            expand: false,
            tenant: Some(c.uid),
        };
        let first = Instant::now();
        let mut judged = ix.past_search(&px, dir, &q)?;
        let search_us = first.elapsed().as_micros() as u64;
        // A result deleted or redacted since the index was built: the
        // next search builds it again, without that text.
        let mut stale = false;
        let mut kept = Vec::with_capacity(judged.len());
        for mut j in judged.drain(..) {
            let then = place::store_path(&j.hit.path).to_string();
            let Some(placed) = view.node(&then) else {
                stale = true;
                continue;
            };
            let Some(rec) = self.placed_rec(placed, access)? else {
                stale |= self.placed_rec(placed, Access::Write)?.is_none();
                continue;
            };
            if rec.status != Status::Active || self.access_of(c, &then) == Access::None {
                continue;
            }
            if px.blob_of(&then) != Some(rec.file(place::CONTENT).map(|f| f.blob)) {
                stale = true;
                continue;
            }
            j.hit.path = format!(
                "accounts/{account}/.as-of/{time}/{}",
                place::in_account(&then)
            );
            kept.push(j);
        }
        if stale {
            self.as_of.forget_past_index(account, *at);
        }
        let more = kept.len() > qn.k;
        kept.truncate(qn.k);
        let answerable = kept
            .first()
            .is_some_and(|j| j.tier >= crate::index::answer::Tier::Medium);
        self.render_results(
            &qn,
            format!(
                "accounts/{account}/.as-of/{time}/{}",
                place::in_account(dir)
            )
            .trim_end_matches('/'),
            crate::core::search::Results {
                judged: &kept,
                tried: Vec::new(),
                answered_by: qn.text.clone(),
                answerable,
                more,
                took_us: (t.elapsed().as_micros() as u64, search_us),
                packed: None,
            },
        )
    }
}
