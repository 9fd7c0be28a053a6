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

use super::{Balance, OutlierDetection, Outliers, ResponseBody, ResponseFuture};
use crate::error::BoxError;

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
/// Each attempt goes to a backend its call has not tried when the call carries a
/// [`TriedBackends`](crate::metadata::TriedBackends) record: every call of a hedging policy
/// does by default; a retry policy's calls do when the policy table was built with
/// [`track_backends(true)`](crate::policy::PoliciesBuilder::track_backends). A call without a
/// record is balanced attempt by attempt, as if each attempt were a call of its own (see the
/// [module docs](super#the-record-of-backends-tried)).
///
/// Outlier detection is on, with [`OutlierDetection::default()`]: a backend that keeps failing
/// is ejected for a while, and recent failures weigh the choice (see the
/// [module docs](super#outlier-detection)). [`BalancedChannel::builder`] sets other knobs;
/// [`outliers`](BalancedChannel::outliers) shows who is out.
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
    outliers: Outliers,
}

impl fmt::Debug for BalancedChannel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BalancedChannel")
            .field("outliers", &self.outliers)
            .finish_non_exhaustive()
    }
}

impl BalancedChannel {
    /// Balances over a fixed list of endpoints, each known by its URI (its [`BackendId`] is
    /// `BackendId::of(endpoint.uri())`); endpoints with the same URI count once.
    ///
    /// [`BackendId`]: crate::metadata::BackendId
    pub fn balance_list(endpoints: impl IntoIterator<Item = Endpoint>) -> Self {
        BalancedChannel::builder().balance_list(endpoints)
    }

    /// Balances over the endpoints inserted into the returned sender, until they are removed:
    /// a channel of `capacity` changes, each endpoint known by its key `K` (its
    /// [`BackendId`] is `BackendId::of(&key)`; events name it as `Debug` writes it). Inserting
    /// a key again replaces its endpoint once the new one is ready, and keeps what the
    /// balancer learned of it. Dropping the sender keeps the endpoints as they are.
    ///
    /// [`BackendId`]: crate::metadata::BackendId
    pub fn balance_channel<K>(capacity: usize) -> (Self, mpsc::Sender<Change<K, Endpoint>>)
    where
        K: Hash + Eq + Clone + fmt::Debug + Send + 'static,
    {
        BalancedChannel::builder().balance_channel(capacity)
    }

    /// A builder for a channel with other settings than the defaults.
    ///
    /// ```no_run
    /// # async fn example() -> Result<(), tower_retry_hedge::BoxError> {
    /// use std::time::Duration;
    /// use tonic::transport::Endpoint;
    /// use tower_retry_hedge::balance::{BalancedChannel, OutlierDetection};
    ///
    /// let detection = OutlierDetection::builder()
    ///     .base_ejection_time(Duration::from_secs(10))
    ///     .build()?;
    /// let endpoints = ["http://10.0.0.1:50051", "http://10.0.0.2:50051"].map(Endpoint::from_static);
    /// let channel = BalancedChannel::builder()
    ///     .outlier_detection(detection)
    ///     .balance_list(endpoints);
    /// # let _ = channel;
    /// # Ok(())
    /// # }
    /// ```
    pub fn builder() -> BalancedChannelBuilder {
        BalancedChannelBuilder {
            outlier_detection: OutlierDetection::default(),
        }
    }

    /// A view of the backends the channel's outlier detection ejected, shared with the
    /// balancer.
    ///
    /// ```no_run
    /// # async fn example(channel: tower_retry_hedge::balance::BalancedChannel) {
    /// for ejection in channel.outliers().ejected() {
    ///     println!("{} is out until {:?} ({})", ejection.key, ejection.until, ejection.reason);
    /// }
    /// # }
    /// ```
    pub fn outliers(&self) -> Outliers {
        self.outliers.clone()
    }
}

/// Builds a [`BalancedChannel`] with other settings than the defaults; see
/// [`BalancedChannel::builder`].
///
/// ```no_run
/// # async fn example() {
/// use tonic::transport::Endpoint;
/// use tower_retry_hedge::balance::{BalancedChannel, OutlierDetection};
///
/// // The balancer as it was before outlier detection: the calls' records alone.
/// let (channel, changes) = BalancedChannel::builder()
///     .outlier_detection(OutlierDetection::disabled())
///     .balance_channel::<&'static str>(16);
/// # let _ = (channel, changes);
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct BalancedChannelBuilder {
    outlier_detection: OutlierDetection,
}

impl BalancedChannelBuilder {
    /// The outlier detection ([`OutlierDetection::default()`] unless set);
    /// [`OutlierDetection::disabled()`] turns it off.
    pub fn outlier_detection(mut self, config: OutlierDetection) -> Self {
        self.outlier_detection = config;
        self
    }

    /// As [`BalancedChannel::balance_list`].
    pub fn balance_list(self, endpoints: impl IntoIterator<Item = Endpoint>) -> BalancedChannel {
        let changes: Vec<Result<_, Infallible>> = endpoints
            .into_iter()
            .map(|endpoint| {
                Ok(TowerChange::Insert(
                    endpoint.uri().clone(),
                    connect(&endpoint),
                ))
            })
            .collect();
        self.build(futures_util::stream::iter(changes))
    }

    /// As [`BalancedChannel::balance_channel`].
    pub fn balance_channel<K>(
        self,
        capacity: usize,
    ) -> (BalancedChannel, mpsc::Sender<Change<K, Endpoint>>)
    where
        K: Hash + Eq + Clone + fmt::Debug + Send + 'static,
    {
        let (sender, receiver) = mpsc::channel(capacity);
        (self.build(Changes { receiver }), sender)
    }

    fn build<K, D>(self, discover: D) -> BalancedChannel
    where
        K: Hash + Eq + Clone + fmt::Debug + Send + 'static,
        D: Stream<Item = Result<TowerChange<K, EndpointService>, Infallible>>
            + Unpin
            + Send
            + 'static,
    {
        let balance = Balance::new(discover).outlier_detection(self.outlier_detection);
        let outliers = balance.outliers();
        BalancedChannel {
            buffer: Buffer::new(balance, BUFFER_CAPACITY),
            outliers,
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
        let response = ready!(self.project().inner.poll(cx))?;
        Poll::Ready(Ok(response.map(into_tonic)))
    }
}

/// tonic's body: the endpoint's own when the balancer has nothing more to learn from it, else
/// the body that reads its trailers, boxed.
fn into_tonic(mut body: ResponseBody<Body>) -> Body {
    body.settle_if_ended();
    if body.is_watched() {
        Body::new(body)
    } else {
        body.into_inner()
    }
}
