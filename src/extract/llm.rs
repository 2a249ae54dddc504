//! An OpenAI-compatible chat-completions client (`POST {url}/chat/completions`):
//! llama.cpp's server, Ollama, vLLM and hosted APIs. Answers are asked as
//! JSON under a schema (`response_format: json_schema`) and checked here; an
//! answer that is not JSON gets one repair request.

use serde_json::{json, Value};
use std::time::Duration;

/// Every name in the `required` lists of `schema`, outermost first.
pub fn required_order(schema: &Value) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut todo = vec![schema];
    while let Some(v) = todo.pop() {
        match v {
            Value::Object(m) => {
                for name in m
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if let Some(n) = name.as_str().filter(|n| !out.iter().any(|o| o == n)) {
                        out.push(n.to_string());
                    }
                }
                todo.extend(m.values().rev());
            }
            Value::Array(a) => todo.extend(a.iter().rev()),
            _ => {}
        }
    }
    out
}

/// `v` as JSON text with every object's keys in the order of `order`
/// (keys it does not name after them, as the map holds them). A JSON map
/// here is sorted; a small model reads and writes fields in the order it
/// is shown them.
pub fn in_order(v: &Value, order: &[String]) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort_by_key(|k| order.iter().position(|o| o == *k).unwrap_or(usize::MAX));
            let fields: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", Value::from(k.as_str()), in_order(&m[k], order)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(|x| in_order(x, order)).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

/// Tokens one request spent (as the server counts them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt + self.completion
    }
    pub fn add(&mut self, o: Usage) {
        self.prompt += o.prompt;
        self.completion += o.completion;
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LlmError {
    /// Worth another try later: timeouts, refused connections, 429, 5xx,
    /// an answer that stayed invalid after the repair request.
    Transient(String),
    /// Another try gives the same: 4xx other than 429 (bad key, unknown model).
    Permanent(String),
}

impl std::fmt::Display for LlmError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LlmError::Transient(s) | LlmError::Permanent(s) => f.write_str(s),
        }
    }
}

/// What `[llm]` in the config sets, resolved.
#[derive(Debug, Clone)]
pub struct LlmSettings {
    /// Base URL (`http://127.0.0.1:8080/v1`) or the full `/chat/completions` address.
    pub url: String,
    pub model: String,
    /// The API key (read from the environment variable the config names).
    pub api_key: Option<String>,
    pub timeout: Duration,
    /// Completion tokens one request may produce.
    pub max_tokens: u32,
}

pub struct Client {
    s: LlmSettings,
    url: String,
    agent: ureq::Agent,
}

fn one_line(s: &str, n: usize) -> String {
    s.chars()
        .take(n)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

impl Client {
    /// Completion tokens one request may produce.
    pub fn max_tokens(&self) -> u32 {
        self.s.max_tokens
    }

    pub fn new(s: LlmSettings) -> Client {
        let url = crate::schema::openai_endpoint(&s.url, "chat/completions");
        let agent = ureq::Agent::config_builder()
            .timeout_global(Some(s.timeout))
            .http_status_as_error(false)
            .build()
            .into();
        Client { s, url, agent }
    }

    pub fn model(&self) -> &str {
        &self.s.model
    }

    /// One request: the answer's message content, the tokens spent, and
    /// whether `stop` ended it. With `stop`, the answer is streamed and
    /// read an item of its top-level list at a time; when `stop` says so
    /// of the items so far, the connection is closed (the server stops
    /// generating) and the content is the answer up to the item before.
    fn complete(
        &self,
        messages: &[Value],
        schema: &Value,
        max_tokens: u32,
        stop: Option<Stop>,
    ) -> Result<(String, Usage, bool), LlmError> {
        // The schema's fields reach the server in the order of its
        // `required` lists: a grammar made from it has the model write them
        // in that order (a JSON map here would send them alphabetically).
        let order = required_order(schema);
        let mut body = json!({
            "model": self.s.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": max_tokens,
            "stream": stop.is_some(),
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "answer", "strict": true, "schema": schema}
            }
        });
        if stop.is_some() {
            body["stream_options"] = json!({"include_usage": true});
        }
        let body = in_order(&body, &order);
        // The request and answer in plaintext, only when asked for
        // (`RUST_LOG=ctxfs::extract::llm=trace`): they hold what users said.
        tracing::trace!(target: "ctxfs::extract::llm", request = %body, "LLM request");
        let mut req = self
            .agent
            .post(&self.url)
            .header("Content-Type", "application/json");
        if let Some(k) = &self.s.api_key {
            req = req.header("Authorization", &format!("Bearer {k}"));
        }
        let transient = |e: &dyn std::fmt::Display| {
            LlmError::Transient(format!("LLM server {}: {e}", self.url))
        };
        let mut resp = req.send(body.as_bytes()).map_err(|e| transient(&e))?;
        let status = resp.status().as_u16();
        let streamed = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        let mut reader = resp.body_mut().with_config().limit(MAX_ANSWER).reader();
        let (content, usage, stopped) = match stop {
            Some(stop) if status == 200 && streamed => read_stream(reader, stop)?,
            _ => {
                // A server that does not stream answers whole.
                let mut text = String::new();
                std::io::Read::read_to_string(&mut reader, &mut text).map_err(|e| transient(&e))?;
                if status != 200 {
                    let msg = format!(
                        "LLM server {} answered {status}: {}",
                        self.url,
                        one_line(&text, 200)
                    );
                    return Err(if status == 429 || status >= 500 {
                        LlmError::Transient(msg)
                    } else {
                        LlmError::Permanent(msg)
                    });
                }
                let v: Value = serde_json::from_str(&text).map_err(|e| {
                    LlmError::Transient(format!("LLM server: the response is not JSON: {e}"))
                })?;
                let content = v["choices"][0]["message"]["content"]
                    .as_str()
                    .ok_or_else(|| {
                        LlmError::Transient("LLM server: no choices[0].message.content".into())
                    })?
                    .to_string();
                (content, v["usage"].clone(), false)
            }
        };
        tracing::trace!(target: "ctxfs::extract::llm", answer = %content, stopped, "LLM answer");
        let tokens = |k: &str, fallback: &str| {
            usage[k]
                .as_u64()
                .unwrap_or_else(|| crate::schema::counters::tokens_of(fallback))
        };
        let usage = Usage {
            prompt: tokens("prompt_tokens", &body),
            completion: tokens("completion_tokens", &content),
        };
        Ok((content, usage, stopped))
    }

    /// Ask for a JSON answer under `schema`; one repair request when the
    /// answer is not a JSON object. Every answered request's tokens are
    /// added to `spent`, whether its answer was of use or not.
    pub fn chat_json(
        &self,
        messages: Vec<Value>,
        schema: &Value,
        spent: &mut Usage,
    ) -> Result<Value, LlmError> {
        self.chat_json_within(messages, schema, self.s.max_tokens, spent)
    }

    /// [`Client::chat_json`] with at most `max_tokens` completion tokens a
    /// request (never more than the configured limit).
    pub fn chat_json_within(
        &self,
        messages: Vec<Value>,
        schema: &Value,
        max_tokens: u32,
        spent: &mut Usage,
    ) -> Result<Value, LlmError> {
        self.ask(messages, schema, max_tokens, None, spent)
    }

    /// [`Client::chat_json`] for an answer `{"KEY": [items...]}`, ended as
    /// soon as `stop` says so of the items written so far: the answer is
    /// then the items before the last, with `"stopped": true` (a small
    /// model that starts repeating itself would go on to `max_tokens`).
    pub fn chat_json_until(
        &self,
        messages: Vec<Value>,
        schema: &Value,
        stop: Stop,
        spent: &mut Usage,
    ) -> Result<Value, LlmError> {
        self.ask(messages, schema, self.s.max_tokens, Some(stop), spent)
    }

    fn ask(
        &self,
        messages: Vec<Value>,
        schema: &Value,
        max_tokens: u32,
        stop: Option<Stop>,
        spent: &mut Usage,
    ) -> Result<Value, LlmError> {
        let max_tokens = max_tokens.min(self.s.max_tokens);
        let (content, u, stopped) = self.complete(&messages, schema, max_tokens, stop)?;
        spent.add(u);
        if stopped {
            let mut v = parse_object(&content).map_err(|e| {
                LlmError::Transient(format!(
                    "the model's answer, stopped early, is not JSON: {e}"
                ))
            })?;
            if let Some(m) = v.as_object_mut() {
                m.insert("stopped".into(), Value::Bool(true));
            }
            return Ok(v);
        }
        let err = match parse_object(&content) {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        if let Some(v) = salvage_list(&content) {
            // Cut at max_tokens in the middle of its list: the items it
            // finished are as good as in a whole answer (a repair request
            // would be cut at the same place).
            tracing::warn!(error = %err, "LLM answer cut short; keeping its complete items");
            return Ok(v);
        }
        tracing::warn!(error = %err, "LLM answer is not valid JSON; asking for a repair");
        let mut again = messages;
        again.push(json!({"role": "assistant", "content": content}));
        again.push(json!({"role": "user", "content": format!(
            "That answer is not valid JSON ({err}). Answer again with only the JSON object, nothing else."
        )}));
        let (content, u, _) = self.complete(&again, schema, max_tokens, None)?;
        spent.add(u);
        match parse_object(&content) {
            Ok(v) => Ok(v),
            Err(e) => Err(LlmError::Transient(format!(
                "the model's answer is not valid JSON after a repair request: {e}"
            ))),
        }
    }
}

/// Bytes of one answer read at most.
const MAX_ANSWER: u64 = 16 << 20;

/// Says, of the items of an answer's list written so far, whether to stop
/// it (the last item is then left out).
pub type Stop<'a> = &'a dyn Fn(&[Value]) -> bool;

/// Read a streamed answer (server-sent events, each `data: {chunk}`, the
/// last `data: [DONE]`): its content, its usage (as the server counts it,
/// or counted here when the answer was stopped before the server said),
/// and whether `stop` ended it.
fn read_stream(reader: impl std::io::Read, stop: Stop) -> Result<(String, Value, bool), LlmError> {
    use std::io::BufRead;
    let err = |e: String| LlmError::Transient(format!("LLM server's stream: {e}"));
    let mut content = String::new();
    let mut usage = Value::Null;
    let mut items = Items::default();
    let mut kept: Vec<Value> = Vec::new();
    for line in std::io::BufReader::new(reader).lines() {
        let line = line.map_err(|e| err(e.to_string()))?;
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let chunk: Value = serde_json::from_str(data).map_err(|e| err(format!("not JSON: {e}")))?;
        if let Some(e) = chunk.get("error") {
            return Err(err(one_line(&e.to_string(), 200)));
        }
        if chunk["usage"].is_object() {
            usage = chunk["usage"].clone();
        }
        let Some(delta) = chunk["choices"][0]["delta"]["content"].as_str() else {
            continue;
        };
        content.push_str(delta);
        for (start, end) in items.feed(&content) {
            let Ok(item) = serde_json::from_str::<Value>(&content[start..end]) else {
                continue;
            };
            kept.push(item);
            if stop(&kept) {
                // The answer up to the item that stopped it, closed.
                let generated = crate::schema::counters::tokens_of(&content);
                let before = content[..start].trim_end().trim_end_matches(',');
                let answer = format!("{before}]}}");
                // Dropping the reader closes the connection: the server
                // stops generating.
                let mut usage = usage;
                if !usage.is_object() {
                    usage = json!({});
                }
                usage["completion_tokens"] = json!(generated);
                return Ok((answer, usage, true));
            }
        }
    }
    Ok((content, usage, false))
}

/// The items of the list in a JSON answer `{"KEY": [item, item, ...`, as
/// its text grows: each item's byte range once it is complete.
#[derive(Debug, Default)]
struct Items {
    /// Bytes of the text read so far.
    read: usize,
    depth: usize,
    in_str: bool,
    esc: bool,
    /// Where the item being read began.
    start: usize,
    /// The list closed (or the text is not of that form).
    done: bool,
}

impl Items {
    /// Read `text` (what was fed before, and more) past what was read: the
    /// items it completes.
    fn feed(&mut self, text: &str) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        if self.done || text.len() < self.read {
            return out;
        }
        for (i, ch) in text[self.read..].char_indices() {
            let i = self.read + i;
            if self.in_str {
                match (self.esc, ch) {
                    (true, _) => self.esc = false,
                    (false, '\\') => self.esc = true,
                    (false, '"') => self.in_str = false,
                    _ => {}
                }
                continue;
            }
            match ch {
                '"' => self.in_str = true,
                '{' | '[' => {
                    self.depth += 1;
                    if self.depth == 3 {
                        self.start = i;
                    }
                }
                '}' | ']' => {
                    let Some(d) = self.depth.checked_sub(1) else {
                        self.done = true;
                        break;
                    };
                    self.depth = d;
                    if d == 2 && ch == '}' {
                        // An item of the top-level object's list closed.
                        out.push((self.start, i + 1));
                    }
                    if d < 2 {
                        // The list closed.
                        self.done = true;
                        break;
                    }
                }
                _ => {}
            }
        }
        self.read = text.len();
        out
    }
}

/// Does the server at `url` (as in `[llm] url`) answer at all? `GET
/// {base}/models` within 2 s; any HTTP answer counts (some servers want a
/// key there). The reason when it does not.
pub fn probe(url: &str) -> Result<(), String> {
    let base = url.trim_end_matches('/');
    let base = base.strip_suffix("/chat/completions").unwrap_or(base);
    let models = crate::schema::openai_endpoint(base, "models");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(Duration::from_secs(2)))
        .http_status_as_error(false)
        .build()
        .into();
    agent
        .get(&models)
        .call()
        .map(|_| ())
        .map_err(|e| format!("{models}: {e}"))
}

/// The complete items of an answer `{"KEY": [item, item, ...` that was cut
/// short (by `max_tokens`) inside its list, as `{"KEY": [items...],
/// "truncated": true}`; `None` when it is not of that form or no item is
/// complete.
pub fn salvage_list(content: &str) -> Option<Value> {
    let t = content.trim_start();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .unwrap_or(t)
        .trim_start();
    let mut items = Items::default();
    let cut = items.feed(t).last()?.1;
    if items.done {
        // The list closed: the answer was not cut inside it.
        return None;
    }
    let mut v: Value = serde_json::from_str(&format!("{}]}}", &t[..cut])).ok()?;
    v.as_object_mut()?
        .insert("truncated".into(), Value::Bool(true));
    Some(v)
}

/// A JSON object from a model's answer (a fenced block is unwrapped).
pub fn parse_object(content: &str) -> Result<Value, String> {
    let t = content.trim();
    let t = t
        .strip_prefix("```json")
        .or_else(|| t.strip_prefix("```"))
        .map(|r| r.trim_end().trim_end_matches("```"))
        .unwrap_or(t);
    match serde_json::from_str::<Value>(t) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_is_sent_in_the_order_of_its_required_lists() {
        let schema = json!({"type": "object", "properties": {
            "b \"q\"": {"type": "string"}, "a": {"type": "integer"}, "zé": {"type": "string"}},
            "required": ["zé", "b \"q\""]});
        let order = required_order(&schema);
        assert_eq!(order, ["zé", "b \"q\""]);
        let text = in_order(&schema, &order);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), schema);
        let at = |k: &str| text.find(k).unwrap();
        assert!(
            at("\"zé\":{") < at("\"b \\\"q\\\"\":{") && at("\"b \\\"q") < at("\"a\":{"),
            "{text}"
        );
    }

    #[test]
    fn an_answer_cut_in_its_list_keeps_its_complete_items() {
        let cut = r#"{"memories": [{"kind": "event", "text": "a \"quoted\" {brace}", "messages": [1]}, {"kind": "entity", "text": "b", "messages": [2, 3]}, {"kind": "ev"#;
        let v = salvage_list(cut).unwrap();
        assert_eq!(v["memories"].as_array().unwrap().len(), 2);
        assert_eq!(v["memories"][0]["text"], "a \"quoted\" {brace}");
        assert_eq!(v["truncated"], true);
        // Nothing complete, not a list, or not cut: nothing to salvage.
        assert!(salvage_list(r#"{"memories": [{"kind": "ev"#).is_none());
        assert!(salvage_list(r#"{"text": "abc"#).is_none());
        assert!(salvage_list(r#"{"memories": [{"a": 1}]} trailing"#).is_none());
    }

    /// A server-sent event stream of `pieces` of an answer.
    fn sse(pieces: &[&str], usage: bool) -> Vec<u8> {
        let mut out = String::new();
        for p in pieces {
            out += &format!(
                "data: {}\n\n",
                json!({"choices": [{"delta": {"content": p}}]})
            );
        }
        if usage {
            out += "data: {\"choices\": [], \"usage\": {\"prompt_tokens\": 7, \"completion_tokens\": 9}}\n\n";
        }
        out += "data: [DONE]\n\n";
        out.into_bytes()
    }

    #[test]
    fn a_streamed_answer_is_stopped_at_the_item_stop_names() {
        let pieces = [
            "{\"memories\": [{\"q\": \"a } [\\\" b\"}",
            ", {\"q\": \"c\"}, {\"q\"",
            ": \"a } [\\\" b\"}, {\"q\": \"d\"}]}",
        ];
        let repeats = |items: &[Value]| {
            let (last, before) = items.split_last().unwrap();
            before.contains(last)
        };
        let (content, usage, stopped) = read_stream(&sse(&pieces, true)[..], &repeats).unwrap();
        assert!(stopped);
        let v = parse_object(&content).unwrap();
        assert_eq!(v, json!({"memories": [{"q": "a } [\" b"}, {"q": "c"}]}));
        // Stopped before the server's count: counted here.
        assert!(usage["completion_tokens"].as_u64().unwrap() > 0);

        // Read to the end when nothing stops it; the server's count.
        let never = |_: &[Value]| false;
        let (content, usage, stopped) = read_stream(&sse(&pieces, true)[..], &never).unwrap();
        assert!(!stopped);
        assert_eq!(
            parse_object(&content).unwrap()["memories"]
                .as_array()
                .unwrap()
                .len(),
            4
        );
        assert_eq!(usage["completion_tokens"], 9);

        // An error event is an error.
        let bad = b"data: {\"error\": {\"message\": \"overloaded\"}}\n\n";
        assert!(read_stream(&bad[..], &never).is_err());
    }

    #[test]
    fn parses_answers() {
        assert!(parse_object("{\"a\":1}").is_ok());
        assert!(parse_object("```json\n{\"a\":1}\n```").is_ok());
        assert!(parse_object("[1]").is_err());
        assert!(parse_object("{\"a\":").is_err());
    }

    #[test]
    fn urls() {
        let mk = |u: &str| {
            Client::new(LlmSettings {
                url: u.into(),
                model: "m".into(),
                api_key: None,
                timeout: Duration::from_secs(1),
                max_tokens: 10,
            })
            .url
        };
        assert_eq!(mk("http://h:1/v1"), "http://h:1/v1/chat/completions");
        assert_eq!(mk("http://h:1/"), "http://h:1/v1/chat/completions");
        assert_eq!(
            mk("http://h:1/v1/chat/completions"),
            "http://h:1/v1/chat/completions"
        );
    }
}
