//! [`BalancedChannel`]: the balancer over tonic endpoints, in place of tonic's balanced
//! `Channel` (feature `tonic-transport`).

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures_util::Stream;
use tokio::sync::mpsc;
use tonic::body::Body;
use tonic::transport::channel::Change;
use tonic::transport::{Channel, Endpoint};
use tower::buffer::Buffer;
use tower::discover::Change as TowerChange;
use tower::load::completion::TrackCompletionFuture;
use tower::load::pending_requests::Handle;
use tower::load::{CompleteOnResponse, PendingRequests};
use tower_service::Service;

use super::{Balance, ResponseFuture};
use crate::BoxError;

/// The requests of tonic's generated clients.
type Request = http::Request<Body>;

/// One backend: a tonic channel to it, which counts its requests in flight for the balancer.
type EndpointService = PendingRequests<Channel>;

/// What the buffer waits on for a request: the balancer's future over an endpoint's.
type BalanceFuture = ResponseFuture<
    TrackCompletionFuture<tonic::transport::channel::ResponseFuture, CompleteOnResponse, Handle>,
>;

/// Requests the buffer holds while the balancer is busy: tonic's default for its channels.
const BUFFER_CAPACITY: usize = 1024;

/// A tonic channel over several backends that sends each attempt of a call to a backend the
/// call has not tried: [`Balance`] over tonic [`Endpoint`]s, behind a [`Buffer`].
///
/// It takes the place of a balanced tonic `Channel`, one line for the other:
/// `Channel::balance_list(endpoints)` becomes
/// [`BalancedChannel::balance_list(endpoints)`](BalancedChannel::balance_list), and
/// `Channel::balance_channel(n)` becomes
/// [`BalancedChannel::balance_channel(n)`](BalancedChannel::balance_channel), with tonic's own
/// [`Change`] type. The generated client takes it, or the retry and hedge layers over it, as
/// it takes a `Channel`: it is a `Service<http::Request<tonic::body::Body>>` answering
/// `http::Response<tonic::body::Body>`, with [`BoxError`] errors.
///
/// Each endpoint is a lazily connected tonic `Channel` ([`Endpoint::connect_lazy`]) wrapped in
/// tower's [`PendingRequests`]: the load the balancer compares is the number of requests in
/// flight on it, until their response headers. tonic's balancer gives every endpoint the same
/// load, so its pick is uniform.
///
/// # Why a buffer
///
/// The retry and hedge layers clone their inner service for a call's later attempts, and
/// tonic's generated clients are cloned per task; [`Balance`] owns its endpoints and cannot be
/// cloned. Like tonic's balanced `Channel`, this one is a handle to a [`Buffer`] (of 1024
/// requests) whose worker task runs the balancer: clones are cheap and share the endpoints.
/// The price is one hop through the buffer's queue per attempt, as with tonic's balancer.
///
/// # Panics
///
/// The constructors spawn the buffer's worker on the current tokio runtime, and panic outside
/// one, as tonic's do.
#[derive(Clone)]
pub struct BalancedChannel {
    buffer: Buffer<Request, BalanceFuture>,
}

impl fmt::Debug for BalancedChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalancedChannel").finish_non_exhaustive()
    }
}

impl BalancedChannel {
    /// Balances over a fixed list of endpoints, each known by its URI (its [`BackendId`] is
    /// `BackendId::of(endpoint.uri())`); endpoints with the same URI count once.
    ///
    /// [`BackendId`]: crate::metadata::BackendId
    pub fn balance_list(endpoints: impl IntoIterator<Item = Endpoint>) -> Self {
        let changes: Vec<Result<_, Infallible>> = endpoints
            .into_iter()
            .map(|endpoint| {
                Ok(TowerChange::Insert(
                    endpoint.uri().clone(),
                    connect(&endpoint),
                ))
            })
            .collect();
        Self::new(futures_util::stream::iter(changes))
    }

    /// Balances over the endpoints inserted into the returned sender, until they are removed:
    /// a channel of `capacity` changes, each endpoint known by its key `K` (its
    /// [`BackendId`] is `BackendId::of(&key)`). Inserting a key again replaces its endpoint
    /// once the new one is ready. Dropping the sender keeps the endpoints as they are.
    ///
    /// [`BackendId`]: crate::metadata::BackendId
    pub fn balance_channel<K>(capacity: usize) -> (Self, mpsc::Sender<Change<K, Endpoint>>)
    where
        K: Hash + Eq + Clone + Send + 'static,
    {
        let (sender, receiver) = mpsc::channel(capacity);
        (Self::new(Changes { receiver }), sender)
    }

    fn new<K, D>(discover: D) -> Self
    where
        K: Hash + Eq + Clone + Send + 'static,
        D: Stream<Item = Result<TowerChange<K, EndpointService>, Infallible>>
            + Unpin
            + Send
            + 'static,
    {
        BalancedChannel {
            buffer: Buffer::new(Balance::new(discover), BUFFER_CAPACITY),
        }
    }
}

/// A lazily connected channel to `endpoint`, counting its requests in flight.
fn connect(endpoint: &Endpoint) -> EndpointService {
    PendingRequests::new(endpoint.connect_lazy(), CompleteOnResponse::default())
}

/// tonic's changes from a channel, as tower's discovery stream.
struct Changes<K> {
    receiver: mpsc::Receiver<Change<K, Endpoint>>,
}

impl<K> Stream for Changes<K> {
    type Item = Result<TowerChange<K, EndpointService>, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let change = match ready!(self.receiver.poll_recv(cx)) {
            None => return Poll::Ready(None),
            Some(Change::Insert(key, endpoint)) => TowerChange::Insert(key, connect(&endpoint)),
            Some(Change::Remove(key)) => TowerChange::Remove(key),
        };
        Poll::Ready(Some(Ok(change)))
    }
}

impl Service<Request> for BalancedChannel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = ChannelFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.buffer.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> ChannelFuture {
        ChannelFuture {
            inner: self.buffer.call(request),
        }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`BalancedChannel`].
    pub struct ChannelFuture {
        #[pin]
        inner: tower::buffer::future::ResponseFuture<BalanceFuture>,
    }
}

impl fmt::Debug for ChannelFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelFuture").finish_non_exhaustive()
    }
}

impl Future for ChannelFuture {
    type Output = Result<http::Response<Body>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().inner.poll(cx)
    }
}
