//! The ops dashboard (R-UI-1): a page and its script and style sheet, embedded in the binary
//! and served at `/` and `/assets/<file>`. No build step and nothing from elsewhere: the
//! browser reads everything it shows from the REST API with the PAT the user pasted.
//!
//! Every answer carries a strict Content-Security-Policy (only this origin, no inline
//! script or style, no frames), and is revalidated by its ETag (the files change with the
//! binary, so a browser never runs an old script against a new API).

use std::sync::LazyLock;

use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Router, http::HeaderName};
use sha2::{Digest, Sha256};

use crate::ApiError;

/// What the page may load and do: its own files and the API on its own origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

/// One embedded file.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    bytes: &'static [u8],
}

const FILES: &[Asset] = &[
    Asset { name: "index.html", content_type: "text/html; charset=utf-8", bytes: include_bytes!("../assets/index.html") },
    Asset { name: "app.js", content_type: "text/javascript; charset=utf-8", bytes: include_bytes!("../assets/app.js") },
    Asset { name: "app.css", content_type: "text/css; charset=utf-8", bytes: include_bytes!("../assets/app.css") },
    Asset { name: "favicon.svg", content_type: "image/svg+xml", bytes: include_bytes!("../assets/favicon.svg") },
];

/// Each file's ETag: a digest of its bytes, computed once.
static ETAGS: LazyLock<Vec<String>> = LazyLock::new(|| FILES.iter().map(|f| format!("\"{}\"", hex::encode(&Sha256::digest(f.bytes)[..12]))).collect());

/// `/` and `/assets/{file}`; anything else stays the gateway's (the JSON 404).
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new().route("/", get(index)).route("/assets/{file}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers).unwrap_or_else(IntoResponse::into_response)
}

async fn asset(Path(file): Path<String>, headers: HeaderMap) -> Response {
    // The page itself is only `/`.
    if file == "index.html" {
        return ApiError::new(atasira_domain::ErrorCode::NotFound, "no such route").into_response();
    }
    serve(&file, &headers).unwrap_or_else(IntoResponse::into_response)
}

fn serve(name: &str, headers: &HeaderMap) -> Result<Response, ApiError> {
    let index = FILES.iter().position(|f| f.name == name).ok_or_else(|| ApiError::new(atasira_domain::ErrorCode::NotFound, "no such route"))?;
    let (file, etag) = (&FILES[index], &ETAGS[index]);
    let fresh = headers.get(header::IF_NONE_MATCH).and_then(|v| v.to_str().ok()).is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut response = if fresh { StatusCode::NOT_MODIFIED.into_response() } else { ([(header::CONTENT_TYPE, file.content_type)], file.bytes).into_response() };
    let h = response.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CONTENT_SECURITY_POLICY));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(HeaderName::from_static("cross-origin-opener-policy"), HeaderValue::from_static("same-origin"));
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(name: &str) -> &'static str {
        let file = FILES.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("{name} is embedded"));
        std::str::from_utf8(file.bytes).expect("UTF-8")
    }

    #[test]
    fn r_ui_1_the_page_runs_no_inline_code_and_loads_only_its_own_files() {
        let page = text("index.html");
        // The policy forbids inline script and style: the page has none to be refused.
        assert!(!page.contains("<script>") && !page.contains("<style") && !page.contains("style="), "inline code in index.html");
        let handler =
            page.split(" on").skip(1).find(|rest| rest.split('=').next().is_some_and(|name| !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase())));
        assert!(handler.is_none(), "an inline event handler in index.html: on{handler:?}");
        for src in page.split("src=\"").skip(1).chain(page.split("href=\"").skip(1)) {
            let url = src.split('"').next().unwrap_or_default();
            assert!(url.starts_with("/assets/") || url.starts_with('#'), "index.html loads {url}");
        }
        // The script never writes server text as HTML, and keeps the token out of
        // localStorage.
        let script = text("app.js");
        for pattern in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "localStorage", "eval("] {
            assert!(!script.contains(pattern), "app.js uses {pattern}");
        }
    }

    #[test]
    fn every_file_has_its_own_type_and_tag() {
        for (file, etag) in FILES.iter().zip(ETAGS.iter()) {
            assert!(!file.bytes.is_empty(), "{}", file.name);
            assert!(etag.starts_with('"') && etag.len() == 26, "{etag}");
        }
        let tags: std::collections::BTreeSet<&String> = ETAGS.iter().collect();
        assert_eq!(tags.len(), FILES.len());
    }
}
