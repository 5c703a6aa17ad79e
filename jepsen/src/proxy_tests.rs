use super::*;
use tokio::io::AsyncWriteExt;

/// An echo server; returns its address.
pub(crate) async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// A server that reports every read on a channel and answers each read with `pong`.
async fn recorder() -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    let _ = tx.send(buf[..n].to_vec());
                    let _ = s.write_all(b"pong").await;
                }
            });
        }
    });
    (addr, rx)
}

/// A ping and its 4-byte answer, within `within`.
async fn roundtrip_within(s: &mut TcpStream, within: Duration) -> std::io::Result<Vec<u8>> {
    s.write_all(b"ping").await?;
    let mut buf = [0u8; 4];
    tokio::time::timeout(within, s.read_exact(&mut buf))
        .await
        .map_err(|_| std::io::Error::other("timed out"))??;
    Ok(buf.to_vec())
}

/// A ping through a link that passes it, and its answer: a live proxy answers in
/// microseconds, so the deadline is one only a hang crosses.
pub(crate) async fn roundtrip(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    roundtrip_within(s, sluice_testwait::HANG).await
}

/// Whether a ping through a cut link goes unanswered (or fails): 300 ms of silence, as a cut
/// link stays silent whatever the load.
pub(crate) async fn unanswered(s: &mut TcpStream) -> bool {
    roundtrip_within(s, Duration::from_millis(300))
        .await
        .is_err()
}

#[tokio::test]
async fn one_way_modes_drop_one_direction_and_reset_on_heal() {
    let (target, mut seen) = recorder().await;
    let cancel = CancellationToken::new();
    let proxy = Proxy::start(target, None, cancel.clone()).await.unwrap();
    let mut live = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(roundtrip(&mut live).await.unwrap(), b"pong");
    assert_eq!(seen.recv().await.unwrap(), b"ping");

    // drop-replies: the request arrives, the reply is lost
    proxy.set(ANY_CALLER, LinkMode::DropReplies);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(unanswered(&mut live).await);
    assert_eq!(seen.recv().await.unwrap(), b"ping");

    // drop-requests on a fresh connection: nothing arrives
    proxy.set(ANY_CALLER, LinkMode::DropRequests);
    let mut fresh = TcpStream::connect(proxy.addr()).await.unwrap();
    assert!(unanswered(&mut fresh).await);
    assert!(seen.try_recv().is_err());

    // back to pass: the broken connections are reset, a new one works
    proxy.heal();
    let mut buf = [0u8; 8];
    let closed = tokio::time::timeout(Duration::from_secs(2), live.read(&mut buf)).await;
    assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    let mut healed = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(roundtrip(&mut healed).await.unwrap(), b"pong");
    cancel.cancel();
}

#[tokio::test]
async fn a_classified_caller_is_cut_alone() {
    let target = echo().await;
    let cancel = CancellationToken::new();
    let first = Arc::new(std::sync::Mutex::new(None::<u16>));
    let named = first.clone();
    // The first connection's caller is "a", every other one "b".
    let classify: Classifier = Arc::new(move |peer: SocketAddr, _local| {
        let mut first = named.lock().unwrap();
        match *first {
            None => {
                *first = Some(peer.port());
                "a".into()
            }
            Some(port) if port == peer.port() => "a".into(),
            Some(_) => "b".into(),
        }
    });
    let proxy = Proxy::start(target, Some(classify), cancel.clone())
        .await
        .unwrap();
    let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(roundtrip(&mut a).await.unwrap(), b"ping");
    let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
    assert_eq!(roundtrip(&mut b).await.unwrap(), b"ping");
    sluice_testwait::wait_until("both classified", sluice_testwait::HANG, || {
        first.lock().unwrap().is_some()
    })
    .await
    .unwrap();

    proxy.set("a", LinkMode::Blackhole);
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(unanswered(&mut a).await);
    assert_eq!(roundtrip(&mut b).await.unwrap(), b"ping");
    cancel.cancel();
}
