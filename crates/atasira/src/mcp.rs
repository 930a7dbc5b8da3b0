//! `atasira mcp`: the MCP server of `atasira-mcp` on stdio (R-MCP-1), for agents that start
//! it as a subprocess. Each tool call is one REST call to a running gateway with the
//! configured PAT (ureq, blocking, on tokio's blocking pool). Standard output carries the
//! protocol only; logs go to stderr.

use std::sync::Arc;
use std::time::Duration;

use atasira_mcp::{ApiAnswer, ApiCall, AtasiraMcp, Backend};
use clap::Args;
use rmcp::model::Extensions;
use rmcp::{ServiceExt as _, transport};
use serde_json::Value;

/// How long one REST call may take.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Where the gateway is and whose token the tools use.
#[derive(Debug, Clone, Args)]
pub struct McpArgs {
    /// Base URL of the gateway's REST API, e.g. http://127.0.0.1:8080 (what `atasira dev`
    /// or `atasira serve gateway` listens on).
    #[arg(long, env = "ATASIRA_BFF_URL", value_name = "URL")]
    pub url: Option<String>,
    /// Personal access token the tools call the API with (`atasira tokens create` issues
    /// one). Its role decides what the tools may do, as over REST: listing pending drafts
    /// needs role admin.
    #[arg(long, env = "ATASIRA_PAT", hide_env_values = true, value_name = "PAT")]
    pub token: Option<String>,
}

/// Serves MCP on stdin/stdout until the client closes it.
pub async fn serve(args: McpArgs) -> anyhow::Result<()> {
    let url = args.url.filter(|u| !u.trim().is_empty()).ok_or_else(|| anyhow::anyhow!("no gateway URL: pass --url or set ATASIRA_BFF_URL"))?;
    let token = args.token.filter(|t| !t.trim().is_empty()).ok_or_else(|| anyhow::anyhow!("no token: pass --token or set ATASIRA_PAT"))?;
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        anyhow::bail!("the gateway URL must start with http:// or https://, not {url:?}");
    }
    let base = format!("{}/api/v1", url.trim_end_matches('/'));
    tracing::info!(api = %base, "serving MCP on stdio");
    let backend = Arc::new(Http { base, token, agent: ureq::AgentBuilder::new().timeout(TIMEOUT).build() });
    let server = AtasiraMcp::new(backend).serve(transport::stdio()).await.map_err(|e| anyhow::anyhow!("the MCP client did not start a session: {e}"))?;
    server.waiting().await.map_err(|e| anyhow::anyhow!("the MCP session failed: {e}"))?;
    Ok(())
}

/// Calls the gateway's REST API over HTTP with one PAT.
struct Http {
    base: String,
    token: String,
    agent: ureq::Agent,
}

#[async_trait::async_trait]
impl Backend for Http {
    async fn call(&self, call: ApiCall, _: &Extensions) -> Result<ApiAnswer, String> {
        let url = format!("{}{}", self.base, call.path);
        let request = self.agent.request(call.method.as_str(), &url).set("Authorization", &format!("Bearer {}", self.token));
        let outcome = tokio::task::spawn_blocking(move || {
            let answer = match call.body {
                Some(body) => request.send_json(body),
                None => request.call(),
            };
            let (status, response) = match answer {
                Ok(response) => (response.status(), response),
                Err(ureq::Error::Status(status, response)) => (status, response),
                Err(ureq::Error::Transport(e)) => return Err(format!("cannot reach the API at {url}: {e}")),
            };
            let text = response.into_string().map_err(|e| format!("the API's answer could not be read: {e}"))?;
            Ok(ApiAnswer { status, body: serde_json::from_str(&text).unwrap_or(Value::String(text)) })
        })
        .await;
        let answer = outcome.map_err(|e| format!("the call was interrupted: {e}"))?;
        if let Err(reason) = &answer {
            tracing::warn!(%reason, "API call failed");
        }
        answer
    }
}
