//! The skeleton every protocol mounted under a prefix with a grammar of its own shares (the
//! Hub API, the OCI registry): paths too free for axum's router (repository names hold `/`)
//! go to one fallback handler, which hands each request to the protocol's [`Grammar`], answers
//! a refusal in the protocol's own error format and wears the common layers. Each protocol
//! brings its grammar, its route labels and its errors; nothing here knows a route.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};

use super::{ClientIdentity, Refusals, RouteLabels, with_common_layers};
use crate::config::Config;

/// A protocol that routes the requests below its prefix itself.
pub(crate) trait Grammar: Send + Sync + 'static {
    /// Its error, answered in the protocol's own format.
    type Error: IntoResponse;

    /// The answer to `request` (its path is below the prefix), whose body is `body`, unread: a
    /// protocol reads it only for a route that takes one, within a bound of its own.
    fn answer(
        self: Arc<Self>,
        request: PrefixedRequest,
        body: Body,
    ) -> impl Future<Output = Result<Response, Self::Error>> + Send;

    /// The metric label of a request, from its path below the prefix.
    fn route_label(uri: &Uri) -> &'static str;

    /// The answer when a handler panicked.
    fn panicked() -> Response;

    /// The answer when no answer started within `limits.request_timeout_secs`.
    fn timed_out() -> Response;

    /// Headers every answer carries, errors included (the registry's API version).
    fn finish(_response: &mut Response) {}
}

/// One request below a protocol's prefix, but its body.
pub(crate) struct PrefixedRequest {
    pub(crate) method: Method,
    pub(crate) uri: Uri,
    pub(crate) headers: HeaderMap,
    client: Option<Arc<ClientIdentity>>,
}

impl PrefixedRequest {
    /// The identities of the client certificate, under mutual TLS.
    pub(crate) fn client_names(&self) -> Option<&[String]> {
        self.client.as_ref().map(|identity| identity.names.as_slice())
    }

    /// Refuses the request with `refuse(method, allowed)` unless its method is one of
    /// `allowed` (`"GET, HEAD"`, as an `Allow` header lists them).
    pub(crate) fn only<E>(
        &self,
        allowed: &'static str,
        refuse: impl FnOnce(String, &'static str) -> E,
    ) -> Result<(), E> {
        if allowed.split(", ").any(|m| m == self.method.as_str()) {
            Ok(())
        } else {
            Err(refuse(self.method.to_string(), allowed))
        }
    }
}

/// The router of `grammar`, to be nested under its prefix, with the common layers as `config`
/// says.
pub(crate) fn app<G: Grammar>(grammar: Arc<G>, config: &Config) -> Router {
    let router = Router::new().fallback(dispatch::<G>).with_state(grammar);
    let refusals = Refusals { panicked: G::panicked, timed_out: G::timed_out };
    let labels = RouteLabels { routes: &[], unmatched: G::route_label };
    with_common_layers(router, config, labels, refusals)
}

async fn dispatch<G: Grammar>(State(grammar): State<Arc<G>>, request: axum::extract::Request) -> Response {
    let (parts, body) = request.into_parts();
    let client = parts.extensions.get::<Arc<ClientIdentity>>().cloned();
    let request = PrefixedRequest { method: parts.method, uri: parts.uri, headers: parts.headers, client };
    let mut response = match grammar.answer(request, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    };
    G::finish(&mut response);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method) -> PrefixedRequest {
        PrefixedRequest { method, uri: Uri::from_static("/x"), headers: HeaderMap::new(), client: None }
    }

    #[test]
    fn only_the_methods_a_route_allows_pass_and_the_refusal_names_them() {
        let refuse = |method: String, allowed: &'static str| format!("{method} not in {allowed}");
        assert_eq!(request(Method::HEAD).only("GET, HEAD", refuse), Ok(()));
        assert_eq!(request(Method::GET).only("GET", refuse), Ok(()));
        assert_eq!(request(Method::PUT).only("GET, HEAD", refuse), Err("PUT not in GET, HEAD".to_owned()));
        assert_eq!(request(Method::GET).only("POST", refuse), Err("GET not in POST".to_owned()), "no prefix match");
    }
}
