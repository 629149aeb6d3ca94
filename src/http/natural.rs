//! Natural model URLs: `/models/org/llama/objects/w` names the model `org/llama` as
//! `/models/org%2Fllama/objects/w` does. Before routing, a path under `/models/` whose model id
//! is written with `/` is rewritten to the one-segment form the routes match. The rule, pure
//! and table-tested here: a first segment that is itself a known id, followed by a model route
//! (nothing, `file`, `files/{name}`, `objects/{object}`, `objects/{object}/components/{role}`,
//! `prefetch`, `regions`, `deltas`),
//! is taken as it is, so the `%2F` form always means exactly its id; otherwise the longest known
//! id whose rest is a model route wins (with models `org` and `org/llama`,
//! `/models/org/llama/file` is `org/llama`'s file and `/models/org/file` is `org`'s). Object
//! names and roles stay one segment each: a `/` in them is written `%2F`. A trailing slash is
//! dropped before the rule applies.

use axum::extract::Request;
use axum::http::Uri;

use crate::api::is_model_route;

/// The one-segment form of `path` when it names a model by its natural id (a known one, or else
/// the shortest id whose rest is a model route, which the routes answer is not a model), or
/// `None` when it needs no rewrite. Every request for model bytes passes here: the usual path
/// (an id in one segment) is settled without allocating anything but the segment list.
pub(super) fn rewrite(path: &str, is_model: impl Fn(&str) -> bool) -> Option<String> {
    let rest = path.strip_prefix("/models/")?;
    let segments: Vec<&str> = rest.split('/').collect();
    if segments.len() < 2 {
        return None;
    }
    // The id of the first `split` segments, as written and decoded, and what follows it.
    let id_end = |split: usize| segments[..split].iter().map(|s| s.len() + 1).sum::<usize>() - 1;
    let id = |split: usize| percent_encoding::percent_decode_str(&rest[..id_end(split)]).decode_utf8().ok();
    let route = |split: usize| is_model_route(&segments[split..]).then(|| id(split)).flatten().map(|id| (id, split));
    if is_model_route(&segments[1..]) && id(1).is_some_and(|id| is_model(&id)) {
        return None;
    }
    // The longest known id; else the path as written when it is the one-segment form, or the
    // shortest unknown id (the most route after it): the routes then answer it is not a model.
    let known = (2..=segments.len()).rev().filter_map(route).find(|(id, _)| is_model(id));
    let (id, split) = match known {
        Some(found) => found,
        None if is_model_route(&segments[1..]) => return None,
        None => (2..=segments.len()).find_map(route)?,
    };
    Some(crate::api::encoded_model_url(&id) + &rest[id_end(split)..])
}

/// Rewrites `request`'s URI as [`rewrite`] says, keeping its query. A trailing slash names the
/// same thing as the path without it (fsspec's `ls` asks `/models/org/llama/`), so it is dropped
/// first, but for `…/objects/`: that is the URL of an object named "" (ztensor 1.2.3 writes
/// such objects), which the manifest gives.
pub(super) fn rewrite_request(mut request: Request, is_model: impl Fn(&str) -> bool) -> Request {
    let written = request.uri().path();
    let trimmed = match written.trim_end_matches('/') {
        "" => written,
        _ if names_the_unnamed_object(written) => written,
        trimmed => trimmed,
    };
    let path = match rewrite(trimmed, is_model) {
        Some(path) => path,
        None if trimmed.len() < written.len() => trimmed.to_owned(),
        None => return request,
    };
    let path_and_query = match request.uri().query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    if let Ok(uri) = Uri::builder().path_and_query(path_and_query).build() {
        *request.uri_mut() = uri;
    }
    request
}

/// Whether `path` is `/models/{id}/objects/`, the URL of the object named "".
fn names_the_unnamed_object(path: &str) -> bool {
    path.strip_prefix("/models/").and_then(|rest| rest.strip_suffix("/objects/")).is_some_and(|id| !id.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn natural_ids_resolve_to_the_longest_known_id_whose_rest_is_a_model_route() {
        let ids = ["org", "org/llama", "org/llama/v2", "a b/c", "org/objects"];
        let known = |id: &str| ids.contains(&id);
        let cases: &[(&str, Option<&str>)] = &[
            ("/models/org/llama", Some("/models/org%2Fllama")),
            ("/models/org/llama/file", Some("/models/org%2Fllama/file")),
            (
                "/models/org/llama/files/model.safetensors.index.json",
                Some("/models/org%2Fllama/files/model.safetensors.index.json"),
            ),
            ("/models/org/llama/objects/w", Some("/models/org%2Fllama/objects/w")),
            (
                "/models/org/llama/objects/a%2Fb/components/data",
                Some("/models/org%2Fllama/objects/a%2Fb/components/data"),
            ),
            ("/models/org/llama/v2/objects/w", Some("/models/org%2Fllama%2Fv2/objects/w")),
            ("/models/org/file", None),
            ("/models/org/objects/w", None),
            // A prefix of another id: the other id's rest must be a route.
            ("/models/org/objects/objects/w", Some("/models/org%2Fobjects/objects/w")),
            ("/models/a%20b/c/objects/w", Some("/models/a%20b%2Fc/objects/w")),
            // The one-segment form is never rewritten, nor what names no model.
            ("/models/org%2Fllama/objects/w", None),
            ("/models/org", None),
            ("/models/nothing/here/objects/w", Some("/models/nothing%2Fhere/objects/w")),
            ("/models/org/nothing", Some("/models/org%2Fnothing")),
            ("/models/org/llama/objects/w/extra", Some("/models/org%2Fllama%2Fobjects%2Fw%2Fextra")),
            ("/models/org/llama/components", Some("/models/org%2Fllama%2Fcomponents")),
            ("/models/org%2Fnothing/objects/w", None),
            ("/healthz", None),
            ("/models/%ff/x/file", None),
        ];
        for (path, expected) in cases {
            assert_eq!(rewrite(path, known).as_deref(), *expected, "{path}");
        }
    }

    #[test]
    fn a_trailing_slash_names_what_the_path_without_it_names_and_the_query_is_kept() {
        let known = |id: &str| id == "org/llama";
        let rewritten = |uri: &str| {
            let request = Request::builder().uri(uri).body(axum::body::Body::empty()).unwrap();
            rewrite_request(request, known).uri().to_string()
        };
        assert_eq!(rewritten("/models/org/llama/"), "/models/org%2Fllama");
        assert_eq!(rewritten("/models/org/llama//?x=1"), "/models/org%2Fllama?x=1");
        assert_eq!(rewritten("/models/"), "/models");
        assert_eq!(rewritten("/healthz/"), "/healthz");
        assert_eq!(rewritten("/"), "/");
        assert_eq!(rewritten("/models/org%2Fllama"), "/models/org%2Fllama");
        // The object named "" keeps its slash, in either form of the id.
        assert_eq!(rewritten("/models/org/llama/objects/"), "/models/org%2Fllama/objects/");
        assert_eq!(rewritten("/models/org%2Fllama/objects/"), "/models/org%2Fllama/objects/");
        assert_eq!(
            rewritten("/models/org/llama/objects//components/data"),
            "/models/org%2Fllama/objects//components/data"
        );
    }
}
