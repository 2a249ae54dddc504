//! `ctxfs mcp`: a Model Context Protocol server over stdio (rmcp, on a tokio
//! runtime of its own). Every tool is a thin layer over the files of the
//! mount (`super::Front`), run as the uid that started the server, so what a
//! client may do is exactly what that uid may do in a shell. File work runs
//! on tokio's blocking pool: a FUSE call may wait on a commit's sync.

use super::{memtool, Front, FrontError, FrontResult, NodeWrite};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult, Resource,
    ResourceContents, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RoleServer};
use rmcp::{ErrorData as McpError, ServerHandler, ServiceExt};
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The resource URIs: the scope's memory map and its prompt header.
pub const MAP_URI: &str = "ctxfs://map";
pub const HEADER_URI: &str = "ctxfs://header";

#[derive(Clone)]
pub struct Server {
    front: Arc<Front>,
}

impl Server {
    pub fn new(front: Front) -> Self {
        Server {
            front: Arc::new(front),
        }
    }
}

/// Serve MCP on stdin/stdout until the client closes them.
pub fn serve_stdio(front: Front) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let service = Server::new(front)
            .serve(rmcp::transport::stdio())
            .await
            .map_err(|e| anyhow::anyhow!("MCP handshake failed: {e}"))?;
        service.waiting().await?;
        Ok(())
    })
}

fn schema(v: Value) -> Arc<JsonObject> {
    match v {
        Value::Object(m) => Arc::new(m),
        _ => Arc::new(Map::new()),
    }
}

fn string(desc: &str) -> Value {
    json!({"type": "string", "description": desc})
}

/// The tools, with their input schemas.
pub fn tools() -> Vec<Tool> {
    let files = json!({
        "content": string("the full text (content.md)"),
        "abstract": string("one line, at most 100 characters (.abstract.md); derived from content when left out"),
        "overview": string("headings and first lines (.overview.md); derived when left out"),
        "relations": {"type": "array", "items": {"type": "object"}, "description": "edges: {from_uri, to_uri, relation_type, weight?, reason?}"},
        "meta": {"type": "object", "description": "own fields of .meta.json (tags, ttl_seconds, status: ACTIVE or ARCHIVED)"},
    });
    let with = |mut base: Map<String, Value>, required: &[&str]| {
        if let Value::Object(f) = files.clone() {
            for (k, v) in f {
                base.entry(k).or_insert(v);
            }
        }
        schema(json!({"type": "object", "properties": base, "required": required}))
    };
    let props = |v: Value| match v {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    vec![
        Tool::new(
            "search",
            "Search memory by meaning and keywords. Returns ranked hits: path, uri, abstract, confidence (high/medium/low, or superseded with the newer node in superseded_by), the matching lines of content.md, and whether the question looks answerable.",
            schema(json!({"type": "object", "properties": {
                "query": string("the question or keywords"),
                "k": {"type": "integer", "minimum": 1, "maximum": 100, "description": "how many hits (default 10)"},
                "path": string("search only under this directory (default: the whole scope)"),
                "sync": {"type": "boolean", "description": "first wait until every commit is searchable"},
                "budget": {"type": "integer", "minimum": 128, "maximum": 1000000, "description": "answer with the results packed into at most this many tokens, summary first (abstracts, then overviews, then matching lines), and a line saying what was left out"},
            }, "required": ["query"]})),
        ),
        Tool::new(
            "read",
            "Read a node at a level: abstract (one line), overview, content (optionally a line range) or meta; or any file of the mount by path.",
            schema(json!({"type": "object", "properties": {
                "path": string("a node (memories/CATEGORY/SLUG), a file, or a ctx:// URI"),
                "level": {"type": "string", "enum": ["abstract", "overview", "content", "meta"], "description": "default content"},
                "from_line": {"type": "integer", "minimum": 1},
                "to_line": {"type": "integer", "minimum": 1},
            }, "required": ["path"]})),
        ),
        Tool::new(
            "remember",
            "Write a memory and commit it atomically (a new node, or the next version of an existing one). Give category and slug (under memories/) or path. Returns uri and version.",
            with(
                props(json!({
                    "category": string("e.g. preferences, entities, events"),
                    "slug": string("the node's name: ASCII letters, digits, _ - ."),
                    "path": string("or the node's whole path (e.g. agents/G/skills/NAME)"),
                    "skill": {"type": "boolean", "description": "a skill of the scope's agent (skills/SLUG)"},
                })),
                &["content"],
            ),
        ),
        Tool::new(
            "update",
            "Commit a new version of an existing node: the files given replace the committed ones, the others are kept. With if_version (the version you read), refused with ESTALE when another writer committed the node since; without it, made on the version current when it lands.",
            with(props(json!({"path": string("the node"), "if_version": {"type": "integer", "minimum": 1, "description": "commit only over this version (the one read)"}})), &["path"]),
        ),
        Tool::new(
            "forget",
            "Delete a node and its whole history.",
            schema(json!({"type": "object", "properties": {"path": string("the node")}, "required": ["path"]})),
        ),
        Tool::new(
            "move",
            "Move a node to another place of its account (its URI follows; a new version).",
            schema(json!({"type": "object", "properties": {"from": string("the node"), "to": string("its new place")}, "required": ["from", "to"]})),
        ),
        Tool::new(
            "list",
            "List a directory: nodes with their abstract, directories, files.",
            schema(json!({"type": "object", "properties": {"path": string("default: the scope")}})),
        ),
        Tool::new(
            "map",
            "The memory map of a user or agent: every memory, newest first, with its one-line summary.",
            schema(json!({"type": "object", "properties": {"path": string("a user or agent directory (default: the scope)")}})),
        ),
        Tool::new(
            "history",
            "Every version of a node: number, status, time, content hash.",
            schema(json!({"type": "object", "properties": {"path": string("the node")}, "required": ["path"]})),
        ),
        Tool::new(
            "restore",
            "Make an earlier version of a node current again, as its next version.",
            schema(json!({"type": "object", "properties": {"path": string("the node"), "version": {"type": "integer", "minimum": 1}}, "required": ["path", "version"]})),
        ),
        Tool::new(
            "memory",
            "The memory tool: view, create, str_replace, insert, delete, rename on paths under /memories (each change is a committed, versioned node).",
            schema(json!({"type": "object", "properties": {
                "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "delete", "rename"]},
                "path": string("/memories/..."),
                "file_text": string("create: the file's text"),
                "old_str": string("str_replace: the text to replace (exactly once)"),
                "new_str": string("str_replace: its replacement"),
                "insert_line": {"type": "integer", "minimum": 0, "description": "insert: after this line (0: at the top)"},
                "insert_text": string("insert: the text"),
                "old_path": string("rename: from"),
                "new_path": string("rename: to"),
                "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: [first, last] line (-1: the end)"},
            }, "required": ["command"]})),
        ),
    ]
}

enum Answer {
    Json(Value),
    Text(String),
}

fn node_write(args: &Value) -> NodeWrite {
    let s = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
    NodeWrite {
        content: s("content"),
        abstract_: s("abstract"),
        overview: s("overview"),
        relations: args.get("relations").cloned(),
        meta: args
            .get("meta")
            .and_then(Value::as_object)
            .cloned()
            .unwrap_or_default(),
    }
}

/// Run tool `name` with `args` against the mount.
fn dispatch(front: &Front, name: &str, args: &Value) -> FrontResult<Answer> {
    let s = |k: &str| args.get(k).and_then(Value::as_str);
    let need = |k: &str| s(k).ok_or_else(|| FrontError::invalid(format!("`{k}` is required")));
    let num = |k: &str| args.get(k).and_then(Value::as_u64);
    Ok(match name {
        "search" => {
            let sync = args.get("sync").and_then(Value::as_bool).unwrap_or(false);
            let k = num("k").unwrap_or(10) as usize;
            let budget = num("budget").map(|b| b as usize);
            let v = front.search(need("query")?, k, s("path"), sync, budget)?;
            match v.get("packed").and_then(Value::as_str) {
                // Within a budget the answer is the packed text alone.
                Some(p) if budget.is_some() => Answer::Text(p.to_string()),
                _ => Answer::Json(v),
            }
        }
        "read" => {
            let lines = match (num("from_line"), num("to_line")) {
                (None, None) => None,
                (f, t) => Some((
                    f.unwrap_or(1) as usize,
                    t.unwrap_or(u32::MAX as u64) as usize,
                )),
            };
            Answer::Json(front.read(need("path")?, s("level"), lines)?)
        }
        "remember" => {
            let skill = args.get("skill").and_then(Value::as_bool).unwrap_or(false);
            let node = front.node_place(s("path"), s("category"), s("slug"), skill)?;
            Answer::Json(front.remember(&node, &node_write(args))?)
        }
        "update" => {
            let node = front.rel(need("path")?)?;
            let if_version = match args.get("if_version") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(
                    || FrontError::invalid("`if_version` is the version read, a positive integer"),
                )?),
            };
            Answer::Json(front.update(&node, &node_write(args), if_version)?)
        }
        "forget" => Answer::Json(front.forget(&front.rel(need("path")?)?)?),
        "move" => {
            let (from, to) = (front.rel(need("from")?)?, front.rel(need("to")?)?);
            Answer::Json(front.move_node(&from, &to)?)
        }
        "list" => Answer::Json(front.list(&front.rel(s("path").unwrap_or(""))?)?),
        "map" => Answer::Text(front.map(&front.rel(s("path").unwrap_or(""))?)?),
        "history" => Answer::Json(front.history(&front.rel(need("path")?)?)?),
        "restore" => {
            let v = num("version").ok_or_else(|| FrontError::invalid("`version` is required"))?;
            Answer::Json(front.restore(&front.rel(need("path")?)?, v)?)
        }
        "memory" => match memtool::execute(front, args) {
            Ok(text) => Answer::Text(text),
            Err(text) => {
                return Err(FrontError {
                    errno: None,
                    message: text,
                })
            }
        },
        other => {
            return Err(FrontError::invalid(format!("no tool named {other:?}")));
        }
    })
}

/// A tool's answer as MCP content; a refusal is a tool error (`isError`)
/// whose text and structured content carry the errno and the reason.
fn to_result(name: &str, r: FrontResult<Answer>) -> CallToolResult {
    match r {
        Ok(Answer::Json(v)) => {
            let text = serde_json::to_string_pretty(&v).unwrap_or_default();
            let mut out = CallToolResult::success(vec![ContentBlock::text(text)]);
            out.structured_content = Some(v);
            out
        }
        Ok(Answer::Text(t)) => CallToolResult::success(vec![ContentBlock::text(t)]),
        // The memory tool's errors are its protocol's own text.
        Err(e) if name == "memory" && e.errno.is_none() => {
            CallToolResult::error(vec![ContentBlock::text(e.message)])
        }
        Err(e) => {
            let mut out = CallToolResult::error(vec![ContentBlock::text(e.to_string())]);
            out.structured_content = Some(e.to_json());
            out
        }
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("ctxfs", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Long-term memory on a ctxfs mount. Read the memory map (resource ctxfs://map) first; \
             search before reading; remember commits a node atomically (every change is a new version: \
             history and restore reach the old ones).",
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let front = self.front.clone();
        let name = request.name.to_string();
        let args = Value::Object(request.arguments.unwrap_or_default());
        let out = tokio::task::spawn_blocking(move || {
            let r = dispatch(&front, &name, &args);
            to_result(&name, r)
        })
        .await
        .map_err(|e| McpError::internal_error(format!("tool task failed: {e}"), None))?;
        Ok(out.into())
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, McpError> {
        Ok(ListResourcesResult::with_all_items(vec![
            Resource::new(MAP_URI, "memory map")
                .with_description("every memory of the scope, newest first, with its summary"),
            Resource::new(HEADER_URI, "prompt header")
                .with_description("a short block to put into a system prompt"),
        ]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, McpError> {
        let front = self.front.clone();
        let uri = request.uri.clone();
        let text = tokio::task::spawn_blocking(move || match uri.as_str() {
            MAP_URI => front.map(&front.scope),
            HEADER_URI => front.header(),
            other => Err(FrontError {
                errno: Some(libc::ENOENT),
                message: format!("no resource {other}"),
            }),
        })
        .await
        .map_err(|e| McpError::internal_error(format!("resource task failed: {e}"), None))?
        .map_err(|e| McpError::resource_not_found(e.to_string(), Some(e.to_json())))?;
        Ok(ReadResourceResult::new(vec![ResourceContents::text(text, request.uri)]).into())
    }
}
