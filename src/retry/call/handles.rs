//! What one clone of a layer's service owns: the state its calls share and its own
//! references to the table's policies and throttle.
//!
//! A call keeps its policy and its throttle for as long as it runs, so it takes a reference
//! on each. Taken on the table's own `Arc`s, those counts would be written by every call on
//! every core: one cache line that all cores fight over, on every healthy call. Each clone
//! of the service takes them on copies of its own instead, made at its first call that needs
//! them; a clone of the service starts with none, so services cloned per task or per core
//! share nothing they write.
//!
//! Each of those copies sits alone on its cache lines (128 bytes, two lines, as the
//! adjacent-line prefetcher pairs them): allocated one after another, two clones' copies
//! would otherwise share a line, and once the tasks holding the clones run on different
//! cores, their calls fight over it as over a shared count. Measured with `benches/scaling.rs`
//! on two cores, nothing below: 2-thread scaling of a plain retry policy 0.95–0.97 unpadded,
//! 0.98–0.99 padded (`tower::retry` 0.98–0.99 in the same runs).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use http::Request;

use super::LayerShared;
use crate::policy::{HedgePolicy, MethodPolicy, Policies, RetryPolicy, ThrottleHandle};
use crate::throttle::Padded;

/// The handles one clone of a layer's service owns (see [the module docs](self)). Cloning
/// gives an empty set: the clone makes its own at its first call.
pub(crate) struct Handles<S> {
    /// The spare service and the table, made at the first driven call.
    pub(super) shared: Option<Arc<LayerShared<S>>>,
    /// The last lookup in the table, with this clone's copy of what it found.
    last: Option<LastLookup>,
    /// Copies of the table's retry and hedging policies, by the address of the original.
    policies: HashMap<usize, MethodPolicy, foldhash::fast::RandomState>,
    /// This clone's handle on the table's shared throttle.
    throttle: Option<ThrottleHandle>,
    /// Its handles on the throttles of the authorities it called, when the table keeps one
    /// per authority (a few: a clone mostly talks to one host).
    by_authority: Vec<(Box<str>, ThrottleHandle)>,
}

/// A clone's last lookup in its table: the method and path asked, and what was found.
#[derive(Default)]
struct LastLookup {
    method: http::Method,
    path: String,
    found: Option<(MethodPolicy, Option<usize>)>,
}

/// The longest path a clone remembers its lookup for (gRPC method paths are far shorter).
const REMEMBERED_PATH_MAX: usize = 256;

/// The most authorities a clone keeps handles for; past them, it starts again.
const AUTHORITIES_PER_CLONE: usize = 8;

impl<S> Handles<S> {
    /// This clone's copy of `policy`, made on first use. A copy shares everything the
    /// original shares (its adaptive delay's window, its budget, its hook): only the
    /// reference count calls take is its own.
    pub(super) fn policy<'a>(&'a mut self, policy: &'a MethodPolicy) -> &'a MethodPolicy {
        let key = match policy {
            MethodPolicy::Retry(retry) => Arc::as_ptr(retry) as usize,
            MethodPolicy::Hedge(hedge) => Arc::as_ptr(hedge) as usize,
            // No reference to take.
            MethodPolicy::Timeout(_) | MethodPolicy::WaitForReady(_) => return policy,
        };
        // The table outlives this clone (the service holds it), so an address names one
        // policy for as long as the copy is kept.
        self.policies.entry(key).or_insert_with(|| own_copy(policy))
    }

    /// The policy `policies` gives a call with `method` and `path`, as this clone's own copy
    /// (see [`policy`](Self::policy)), and the route it matched. The clone's last lookup is
    /// remembered: a client calls the same method over and over, and comparing its path
    /// costs less than hashing it twice, into the table and into this clone's copies.
    pub(super) fn lookup(
        &mut self,
        policies: &Policies,
        method: &http::Method,
        path: &str,
    ) -> Option<(MethodPolicy, Option<usize>)> {
        if let Some(last) = &self.last
            && last.path == path
            && last.method == method
        {
            return last.found.clone();
        }
        let found = policies
            .matched(method, path)
            .map(|matched| (self.policy(matched.policy).clone(), matched.route));
        if path.len() > REMEMBERED_PATH_MAX {
            // Not kept: a clone holds no more than a short path's bytes for this.
            self.last = None;
            return found;
        }
        let last = self.last.get_or_insert_with(LastLookup::default);
        // The path's buffer is kept: a clone that alternates between methods does not
        // allocate for each.
        last.path.clear();
        last.path.push_str(path);
        last.method = method.clone();
        last.found = found.clone();
        found
    }

    /// The throttle of `request`'s call: this clone's handle on the table's shared one, or
    /// on the one of the request's authority (looked up in the registry, under its lock,
    /// once per clone and authority).
    pub(super) fn throttle<B>(
        &mut self,
        policies: &Policies,
        request: &Request<B>,
    ) -> Option<ThrottleHandle> {
        if let Some(shared) = policies.shared_throttle() {
            // The same bucket behind a reference count of this clone's own (`Padded`
            // forwards to it).
            let own = self
                .throttle
                .get_or_insert_with(|| Arc::new(Padded(Arc::clone(shared))));
            return Some(Arc::clone(own));
        }
        if !policies.has_authority_throttles() {
            return None;
        }
        let authority = Policies::authority_of(request);
        if let Some((_, own)) = self.by_authority.iter().find(|(a, _)| **a == *authority) {
            return Some(Arc::clone(own));
        }
        let own: ThrottleHandle = Arc::new(Padded(policies.authority_throttle(authority)?));
        if self.by_authority.len() == AUTHORITIES_PER_CLONE {
            self.by_authority.clear();
        }
        self.by_authority.push((authority.into(), Arc::clone(&own)));
        Some(own)
    }
}

/// `policy` behind reference counts of its own; what it shares, the copy still shares.
fn own_copy(policy: &MethodPolicy) -> MethodPolicy {
    match policy {
        MethodPolicy::Retry(retry) => MethodPolicy::Retry(Arc::new(RetryPolicy::clone(retry))),
        MethodPolicy::Hedge(hedge) => MethodPolicy::Hedge(Arc::new(HedgePolicy::clone(hedge))),
        other => other.clone(),
    }
}

impl<S> Default for Handles<S> {
    fn default() -> Self {
        Handles {
            shared: None,
            last: None,
            policies: HashMap::default(),
            throttle: None,
            by_authority: Vec::new(),
        }
    }
}

impl<S> Clone for Handles<S> {
    /// None of them: a clone takes its references on handles of its own.
    fn clone(&self) -> Self {
        Handles::default()
    }
}

impl<S> fmt::Debug for Handles<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handles")
            .field("policies", &self.policies.len())
            .field("throttle", &self.throttle.is_some())
            .field("authorities", &self.by_authority.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::{Code, GrpcCodes};
    use crate::throttle::{RetryThrottle, Throttle, ThrottleState};

    fn retry_table() -> Policies {
        let policy = RetryPolicy::builder()
            .max_attempts(3)
            .retryable(GrpcCodes::from([Code::Unavailable]))
            .build()
            .unwrap();
        Policies::builder()
            .method("svc.S/M", policy)
            .throttle(Throttle::new(10, 0.1).unwrap())
            .build()
    }

    fn retry_of(policy: &MethodPolicy) -> &Arc<RetryPolicy> {
        match policy {
            MethodPolicy::Retry(retry) => retry,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn each_clone_takes_its_references_on_copies_of_its_own() {
        let policies = retry_table();
        let table = policies
            .matched(&http::Method::POST, "/svc.S/M")
            .unwrap()
            .policy;
        let mut first = Handles::<()>::default();
        let copy = Arc::clone(retry_of(first.policy(table)));
        // The same copy for every call of this clone, not the table's.
        assert!(Arc::ptr_eq(&copy, retry_of(first.policy(table))));
        assert!(!Arc::ptr_eq(&copy, retry_of(table)));
        // A clone of the service makes its own.
        let mut second = first.clone();
        assert!(!Arc::ptr_eq(&copy, retry_of(second.policy(table))));
        // Calls hold copies: the table's count is the table's alone.
        assert_eq!(Arc::strong_count(retry_of(table)), 1);
        assert_eq!(copy.max_attempts, 3);
    }

    #[test]
    fn a_clones_last_lookup_is_remembered_and_a_new_method_or_path_looked_up_again() {
        use crate::policy::Route;
        use http::Method;
        let get_only = RetryPolicy::builder().max_attempts(2).build().unwrap();
        let policies = Policies::builder()
            .method("svc.S/M", retry_table_policy())
            .route(Route::prefix("/api").methods([Method::GET]), get_only)
            .build();
        let mut handles = Handles::<()>::default();
        let policy_of = |found: Option<(MethodPolicy, Option<usize>)>| {
            let (policy, route) = found.expect("a policy");
            (Arc::clone(retry_of(&policy)), route)
        };
        let (first, route) = policy_of(handles.lookup(&policies, &Method::POST, "/svc.S/M"));
        assert_eq!((first.max_attempts, route), (3, None));
        let last = handles.last.as_ref().expect("the lookup remembered");
        assert_eq!(
            (&last.method, last.path.as_str()),
            (&Method::POST, "/svc.S/M")
        );
        // Asked again, the clone's own copy comes back, not a new one.
        let (again, _) = policy_of(handles.lookup(&policies, &Method::POST, "/svc.S/M"));
        assert!(Arc::ptr_eq(&first, &again));
        // The route takes GET only: the same path with another method finds nothing.
        let (api, route) = policy_of(handles.lookup(&policies, &Method::GET, "/api/x"));
        assert_eq!((api.max_attempts, route), (2, Some(0)));
        assert!(handles.lookup(&policies, &Method::POST, "/api/x").is_none());
        assert!(handles.lookup(&policies, &Method::GET, "/other").is_none());
        let (back, _) = policy_of(handles.lookup(&policies, &Method::POST, "/svc.S/M"));
        assert!(Arc::ptr_eq(&first, &back));
        // A long path is looked up, not remembered.
        let long = format!("/api/{}", "x".repeat(REMEMBERED_PATH_MAX));
        let (api, _) = policy_of(handles.lookup(&policies, &Method::GET, &long));
        assert_eq!(api.max_attempts, 2);
        assert!(handles.last.is_none());
        assert!(handles.lookup(&policies, &Method::POST, &long).is_none());
    }

    fn retry_table_policy() -> RetryPolicy {
        RetryPolicy::builder()
            .max_attempts(3)
            .retryable(GrpcCodes::from([Code::Unavailable]))
            .build()
            .unwrap()
    }

    #[test]
    fn what_a_clone_writes_per_call_sits_alone_on_its_cache_lines() {
        let policies = retry_table();
        let table = policies
            .matched(&http::Method::POST, "/svc.S/M")
            .unwrap()
            .policy;
        let request = Request::new(());
        let alone = |address: *const u8| (address as usize).is_multiple_of(128);
        // Made one after another, as two clones' first calls make them.
        let mut handles: Vec<Handles<()>> = (0..4).map(|_| Handles::default()).collect();
        for handles in &mut handles {
            let copy = Arc::clone(retry_of(handles.policy(table)));
            let throttle = handles.throttle(&policies, &request).unwrap();
            let shared = super::LayerShared::get_or_make(&mut handles.shared, &(), &policies);
            assert!(alone(Arc::as_ptr(&copy).cast()));
            assert!(alone(Arc::as_ptr(&throttle).cast()));
            assert!(alone(Arc::as_ptr(&shared).cast()));
        }
    }

    #[test]
    fn a_clones_throttle_handle_is_its_own_over_the_same_bucket() {
        let policies = retry_table();
        let request = Request::new(());
        let mut first = Handles::<()>::default();
        let mut second = Handles::<()>::default();
        let a = first.throttle(&policies, &request).unwrap();
        let b = second.throttle(&policies, &request).unwrap();
        assert!(Arc::ptr_eq(
            &a,
            &first.throttle(&policies, &request).unwrap()
        ));
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, policies.shared_throttle().unwrap()));
        // One bucket: a failure through either handle is the table's.
        a.on_failure();
        b.on_failure();
        assert_eq!(
            policies.throttle_state(),
            Some(ThrottleState::Bucket {
                tokens: 8.0,
                max_tokens: 10,
                threshold: 5.0,
                token_ratio: 0.1,
            })
        );
    }

    #[test]
    fn a_clone_keeps_one_handle_per_authority_over_the_registrys_buckets() {
        let registry = crate::throttle::ThrottleRegistry::new(10, 0.1).unwrap();
        let policies = Policies::builder().throttle_per_authority(registry).build();
        let to = |authority: &str| {
            Request::builder()
                .uri(format!("http://{authority}/svc.S/M"))
                .body(())
                .unwrap()
        };
        let mut handles = Handles::<()>::default();
        let a = handles.throttle(&policies, &to("a.example:443")).unwrap();
        let b = handles.throttle(&policies, &to("b.example:443")).unwrap();
        assert!(Arc::ptr_eq(
            &a,
            &handles.throttle(&policies, &to("a.example:443")).unwrap()
        ));
        assert!(!Arc::ptr_eq(&a, &b));
        // Each handle is its authority's bucket in the registry.
        a.on_failure();
        let states = policies.authority_throttle_states();
        let tokens = |authority: &str| match states[authority] {
            ThrottleState::Bucket { tokens, .. } => tokens,
            ref other => panic!("{other:?}"),
        };
        assert_eq!(
            (tokens("a.example:443"), tokens("b.example:443")),
            (9.0, 10.0)
        );
        // A clone makes its own, over the same buckets; past its bound, a clone starts again.
        let mut clone = handles.clone();
        let again = clone.throttle(&policies, &to("a.example:443")).unwrap();
        assert!(!Arc::ptr_eq(&a, &again));
        for n in 0..AUTHORITIES_PER_CLONE + 1 {
            clone.throttle(&policies, &to(&format!("host{n}:80")));
        }
        assert!(clone.by_authority.len() <= AUTHORITIES_PER_CLONE);
    }
}
