//! The gRPC client of the hand-off: tonic, one HTTP/2 channel per endpoint shared by
//! every connection's stream (streams are multiplexed), created lazily.
//!
//! Windows and message sizes are raised from their defaults (64 KiB windows, 4 MiB
//! messages): Kafka frames are up to `max_frame_size`, and a 64 KiB window would cost
//! a round trip per 64 KiB of a 1 MiB Produce.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::{MetadataKey, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};
use tonic_prost::ProstCodec;

use super::proto::{ProcessingRequest, ProcessingResponse, PROCESS};
use super::{BoxFuture, Connector, Exchange};

const WINDOW: u32 = 16 << 20;
const CONNECTION_WINDOW: u32 = 64 << 20;

#[derive(Default)]
pub struct GrpcConnector {
    channels: Mutex<HashMap<String, Channel>>,
}

impl GrpcConnector {
    fn channel(&self, endpoint: &str) -> Result<Channel, String> {
        let mut channels = self.channels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        let channel = Endpoint::from_shared(format!("http://{endpoint}"))
            .map_err(|e| format!("endpoint {endpoint:?}: {e}"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(2))
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .connect_lazy();
        channels.insert(endpoint.to_string(), channel.clone());
        Ok(channel)
    }
}

type Call = BoxFuture<'static, Result<Response<Streaming<ProcessingResponse>>, Status>>;

struct GrpcExchange {
    tx: mpsc::UnboundedSender<ProcessingRequest>,
    /// The call until the service's response headers came (it may send them with its
    /// first reply only).
    call: Option<Call>,
    replies: Option<Streaming<ProcessingResponse>>,
}

impl Connector for GrpcConnector {
    fn open<'a>(&'a self, endpoint: &'a str, metadata: &'a [(String, String)]) -> BoxFuture<'a, Result<Box<dyn Exchange>, String>> {
        Box::pin(async move {
            let channel = self.channel(endpoint)?;
            let mut client = tonic::client::Grpc::new(channel)
                .max_decoding_message_size(usize::MAX)
                .max_encoding_message_size(usize::MAX);
            // Connects (or finds the channel connected): a dead endpoint fails here.
            client.ready().await.map_err(|e| format!("{endpoint}: {e}"))?;
            let (tx, rx) = mpsc::unbounded_channel();
            let mut request = Request::new(UnboundedReceiverStream::new(rx));
            for (key, value) in metadata {
                let key = MetadataKey::from_bytes(key.as_bytes()).map_err(|e| format!("metadata {key:?}: {e}"))?;
                let value = MetadataValue::try_from(value.as_str()).map_err(|e| format!("metadata {key:?}: {e}"))?;
                request.metadata_mut().insert(key, value);
            }
            let call: Call = Box::pin(async move {
                client.streaming(request, PathAndQuery::from_static(PROCESS), ProstCodec::default()).await
            });
            Ok(Box::new(GrpcExchange { tx, call: Some(call), replies: None }) as Box<dyn Exchange>)
        })
    }
}

impl Exchange for GrpcExchange {
    fn send(&mut self, message: ProcessingRequest) -> Result<(), String> {
        self.tx.send(message).map_err(|_| "the stream is closed".to_string())
    }

    fn next(&mut self) -> BoxFuture<'_, Option<Result<ProcessingResponse, String>>> {
        Box::pin(async move {
            if let Some(call) = self.call.as_mut() {
                // Polled in place: a cancelled next() leaves the call where it was.
                let response = call.await;
                self.call = None;
                match response {
                    Ok(response) => self.replies = Some(response.into_inner()),
                    Err(status) => return Some(Err(status.to_string())),
                }
            }
            let replies = self.replies.as_mut()?;
            match replies.message().await {
                Ok(Some(reply)) => Some(Ok(reply)),
                Ok(None) => None,
                Err(status) => Some(Err(status.to_string())),
            }
        })
    }
}
