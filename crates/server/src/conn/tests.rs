//! The watchdog's rules and the per-address table.

use super::*;

// Long enough that a busy machine does not reach a deadline between two statements.
const H: Duration = Duration::from_millis(200);
const I: Duration = Duration::from_millis(400);
const W: Duration = Duration::from_millis(300);

#[test]
fn a_slow_head_times_out_and_an_idle_connection_goes_idle() {
    let a = Activity::new();
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    a.read(b"POST /v1/completions HT");
    std::thread::sleep(H + Duration::from_millis(5));
    assert_eq!(a.verdict(H, I, W), Verdict::HeaderTimeout);

    let b = Activity::new();
    std::thread::sleep(I + Duration::from_millis(5));
    assert_eq!(b.verdict(H, I, W), Verdict::Idle);
}

#[test]
fn an_open_request_is_never_timed_and_its_end_restarts_the_idle_clock() {
    let a = Activity::new();
    a.read(b"POST / HTTP/1.1\r\n\r\n");
    let open = a.request();
    // The client sends more (a pipelined request, HTTP/2 window updates) while the answer
    // streams: still no verdict against it.
    a.read(b"GET /");
    std::thread::sleep(I + Duration::from_millis(5));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    drop(open);
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
}

#[test]
fn http2_frames_are_not_heads() {
    let a = Activity::new();
    a.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    std::thread::sleep(H + Duration::from_millis(5));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    std::thread::sleep(I);
    assert_eq!(a.verdict(H, I, W), Verdict::Idle);
}

use http_body::Body;

/// An endless answer that says when it is dropped.
struct Endless(Arc<AtomicBool>);

impl Body for Endless {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        Poll::Ready(Some(Ok(http_body::Frame::data(bytes::Bytes::from_static(
            b"x",
        )))))
    }
}

impl Drop for Endless {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

type Polled<B> = Poll<Option<Result<http_body::Frame<<B as Body>::Data>, <B as Body>::Error>>>;

fn poll_once<B: Body + Unpin>(b: &mut B) -> Polled<B> {
    Pin::new(b).poll_frame(&mut Context::from_waker(std::task::Waker::noop()))
}

#[test]
fn an_answer_not_asked_for_more_past_the_write_limit_is_cut() {
    // HTTP/1: hyper waits on the whole connection, which is closed.
    let a = Activity::new();
    a.read(b"POST / HTTP/1.1\r\n\r\n");
    let dropped = Arc::new(AtomicBool::new(false));
    let mut body = Tracked::new(Endless(Arc::clone(&dropped)), a.request());
    assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
    std::thread::sleep(W / 2);
    // Asked again in time: the clock starts over.
    assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
    std::thread::sleep(W / 2 + Duration::from_millis(20));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    std::thread::sleep(W / 2);
    assert_eq!(a.verdict(H, I, W), Verdict::WriteTimeout);

    // HTTP/2: only the stalled stream's answer is dropped; the connection stays.
    let a = Activity::new();
    a.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let (gone, alive) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut stalled = Tracked::new(Endless(Arc::clone(&gone)), a.request());
    let mut flowing = Tracked::new(Endless(Arc::clone(&alive)), a.request());
    assert!(matches!(poll_once(&mut stalled), Poll::Ready(Some(Ok(_)))));
    std::thread::sleep(W + Duration::from_millis(20));
    assert!(matches!(poll_once(&mut flowing), Poll::Ready(Some(Ok(_)))));
    let Verdict::StreamsStalled(due) = a.verdict(H, I, W) else {
        panic!("{:?}", a.verdict(H, I, W));
    };
    assert_eq!(a.cancel_waiting(due), 1);
    assert!(
        gone.load(Ordering::SeqCst),
        "the stalled answer was dropped"
    );
    assert!(!alive.load(Ordering::SeqCst), "the flowing one was not");
    // Cut once: the watchdog does not find it again, and hyper gets an error (a reset),
    // not the end of a whole answer.
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    assert!(matches!(poll_once(&mut stalled), Poll::Ready(Some(Err(_)))));
    assert!(!stalled.is_end_stream());
    drop(flowing);
    assert!(alive.load(Ordering::SeqCst));
}

#[test]
fn an_answer_waiting_on_its_engine_is_not_a_stalled_client() {
    struct Waiting;
    impl Body for Waiting {
        type Data = bytes::Bytes;
        type Error = Box<dyn std::error::Error + Send + Sync>;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
            Poll::Pending
        }
    }
    let a = Activity::new();
    a.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    let mut body = Tracked::new(Waiting, a.request());
    assert!(poll_once(&mut body).is_pending());
    std::thread::sleep(W + Duration::from_millis(20));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
}

#[tokio::test]
async fn a_write_the_client_does_not_take_past_the_limit_closes_the_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let a = Activity::new();
    let (ours, mut theirs) = tokio::io::duplex(1024);
    let mut io = TrackedIo::new(ours, Arc::clone(&a), 1024);
    io.write_all(&[b'x'; 1024]).await.expect("fits");
    // Full: the next write waits for the client.
    let more = tokio::time::timeout(Duration::from_millis(20), io.write_all(b"y")).await;
    assert!(more.is_err());
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    // It takes some: the wait is over, and a new one starts from scratch.
    std::thread::sleep(W / 2);
    let mut got = [0u8; 512];
    theirs.read_exact(&mut got).await.expect("read");
    io.write_all(&[b'z'; 512]).await.expect("room again");
    let more = tokio::time::timeout(Duration::from_millis(20), io.write_all(b"y")).await;
    assert!(more.is_err());
    std::thread::sleep(W / 2 + Duration::from_millis(20));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    std::thread::sleep(W / 2);
    assert_eq!(a.verdict(H, I, W), Verdict::WriteTimeout);
}

#[test]
fn per_client_slots_are_counted_and_released() {
    let t = PerClient::new(Some(2));
    let ip: IpAddr = [127, 0, 0, 1].into();
    let other: IpAddr = [127, 0, 0, 2].into();
    let s1 = t.admit(ip);
    let s2 = t.admit(ip);
    assert!(matches!((&s1, &s2), (Ok(Some(_)), Ok(Some(_)))));
    assert_eq!(t.admit(ip).err(), Some(2));
    assert!(matches!(t.admit(other), Ok(Some(_))));
    drop(s1);
    assert_eq!(t.count(ip), 1);
    let s3 = t.admit(ip);
    assert!(s3.is_ok());
    drop((s2, s3));
    assert_eq!(t.count(ip), 0);
    assert!(matches!(PerClient::new(None).admit(ip), Ok(None)));
}
