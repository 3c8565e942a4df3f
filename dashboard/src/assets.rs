//! The front end's files (`dashboard/web/`): embedded in the binary at build time, or read
//! from a directory on each request (`--web-root`, for working on the page without a
//! rebuild). Names are flat (`app.js`, `style.css`); anything else is 404.

use std::path::PathBuf;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

mod embedded {
    include!(concat!(env!("OUT_DIR"), "/assets.rs"));
}

pub enum Assets {
    Embedded,
    Dir(PathBuf),
}

/// The Content-Type of a file name.
pub fn content_type(name: &str) -> &'static str {
    match name.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        Some("json") => "application/json",
        Some("ico") => "image/x-icon",
        _ => "application/octet-stream",
    }
}

fn valid(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b))
}

impl Assets {
    /// The file's bytes, if there is one by that name.
    pub fn bytes(&self, name: &str) -> Option<Vec<u8>> {
        if !valid(name) {
            return None;
        }
        match self {
            Assets::Embedded => embedded::ASSETS.iter().find(|(n, _)| *n == name).map(|(_, b)| b.to_vec()),
            Assets::Dir(dir) => std::fs::read(dir.join(name)).ok(),
        }
    }

    pub fn get(&self, name: &str) -> Response {
        match self.bytes(name) {
            Some(b) => (
                StatusCode::OK,
                [
                    (header::CONTENT_TYPE, content_type(name)),
                    // The page is small and changes with the binary: always ask.
                    (header::CACHE_CONTROL, "no-cache"),
                    (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    (header::X_FRAME_OPTIONS, "DENY"),
                ],
                b,
            )
                .into_response(),
            None => crate::status::status(StatusCode::NOT_FOUND, "NotFound", format!("no file {name:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_page_is_embedded_and_names_are_flat() {
        assert!(Assets::Embedded.bytes("index.html").is_some(), "dashboard/web/index.html is embedded");
        for bad in ["../Cargo.toml", ".hidden", "a/b.js", "", "Index.html"] {
            assert!(Assets::Embedded.bytes(bad).is_none(), "{bad}");
        }
        assert_eq!(content_type("app.js"), "text/javascript; charset=utf-8");
    }

    #[test]
    fn a_web_root_is_read_on_each_request() {
        let dir = tempfile::tempdir().unwrap();
        let assets = Assets::Dir(dir.path().to_path_buf());
        assert!(assets.bytes("x.js").is_none());
        std::fs::write(dir.path().join("x.js"), "1").unwrap();
        assert_eq!(assets.bytes("x.js").unwrap(), b"1");
    }
}
