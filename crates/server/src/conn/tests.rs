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

/// The write limit of the tests below: each step leaves a few hundred milliseconds of slack
/// on either side of a deadline, for a busy machine.
const WL: Duration = Duration::from_millis(800);
const STEP: Duration = Duration::from_millis(400);

fn h2() -> Arc<Activity> {
    let a = Activity::new();
    a.read(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
    a
}

#[test]
fn over_http2_a_stream_left_unread_is_cancelled_then_its_connection_closed() {
    let a = h2();
    let (gone, alive) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let mut stalled = Tracked::new(Endless(Arc::clone(&gone)), a.request());
    let mut flowing = Tracked::new(Endless(Arc::clone(&alive)), a.request());
    assert!(matches!(poll_once(&mut stalled), Poll::Ready(Some(Ok(_)))));
    std::thread::sleep(STEP);
    // Asked again in time: its clock starts over.
    assert!(matches!(poll_once(&mut stalled), Poll::Ready(Some(Ok(_)))));
    std::thread::sleep(STEP);
    assert!(matches!(a.verdict(H, I, WL), Verdict::Wait(_)));
    std::thread::sleep(STEP + Duration::from_millis(100));
    assert!(matches!(poll_once(&mut flowing), Poll::Ready(Some(Ok(_)))));
    // Only the stream left unread is cancelled; the connection stays.
    let Verdict::StreamsStalled(due) = a.verdict(H, I, WL) else {
        panic!("{:?}", a.verdict(H, I, WL));
    };
    assert_eq!(a.cancel_waiting(due), 1);
    assert!(
        gone.load(Ordering::SeqCst),
        "the stalled answer was dropped"
    );
    assert!(!alive.load(Ordering::SeqCst), "the flowing one was not");
    // Cancelled once: the watchdog does not cancel it again.
    assert!(matches!(a.verdict(H, I, WL), Verdict::Wait(_)));
    // hyper still holds it a write limit later (the client never opened its window, so
    // hyper could not reset it): the connection is closed.
    std::thread::sleep(STEP);
    assert!(matches!(poll_once(&mut flowing), Poll::Ready(Some(Ok(_)))));
    assert!(matches!(a.verdict(H, I, WL), Verdict::Wait(_)));
    std::thread::sleep(STEP + Duration::from_millis(100));
    assert!(matches!(poll_once(&mut flowing), Poll::Ready(Some(Ok(_)))));
    assert_eq!(a.verdict(H, I, WL), Verdict::WriteTimeout);
    // Asked again, it is an error (the stream's reset), not the end of a whole answer; once
    // hyper lets it go, nothing is left to time.
    assert!(matches!(poll_once(&mut stalled), Poll::Ready(Some(Err(_)))));
    assert!(!stalled.is_end_stream());
    drop(stalled);
    assert!(matches!(poll_once(&mut flowing), Poll::Ready(Some(Ok(_)))));
    assert!(matches!(a.verdict(H, I, WL), Verdict::Wait(_)));
    drop(flowing);
    assert!(alive.load(Ordering::SeqCst));
}

#[test]
fn over_http1_an_answer_hyper_does_not_ask_for_more_is_left_to_the_socket_rule() {
    // hyper stops asking there only while it flushes to a slow socket: a client reading
    // slowly but steadily must not be cut.
    let a = Activity::new();
    a.read(b"POST / HTTP/1.1\r\n\r\n");
    let mut body = Tracked::new(Endless(Arc::new(AtomicBool::new(false))), a.request());
    assert!(matches!(poll_once(&mut body), Poll::Ready(Some(Ok(_)))));
    std::thread::sleep(W + Duration::from_millis(50));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
    // The same connection turns out to be HTTP/2 (hyper parsed a request as such, the first
    // read held too little of the preface): the stream rule applies.
    a.speaks_h2();
    assert!(matches!(a.verdict(H, I, W), Verdict::StreamsStalled(_)));
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
    let a = h2();
    let mut body = Tracked::new(Waiting, a.request());
    assert!(poll_once(&mut body).is_pending());
    std::thread::sleep(W + Duration::from_millis(20));
    assert!(matches!(a.verdict(H, I, W), Verdict::Wait(_)));
}

#[tokio::test]
async fn a_write_the_client_does_not_take_past_the_limit_closes_the_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Not this test's subject: no idle verdict comes first.
    const IDLE: Duration = Duration::from_secs(30);
    let a = Activity::new();
    let (ours, mut theirs) = tokio::io::duplex(1024);
    let mut io = TrackedIo::new(ours, Arc::clone(&a), 1024);
    io.write_all(&[b'x'; 1024]).await.expect("fits");
    // Full: the next write waits for the client.
    let more = tokio::time::timeout(Duration::from_millis(20), io.write_all(b"y")).await;
    assert!(more.is_err());
    assert!(matches!(a.verdict(H, IDLE, WL), Verdict::Wait(_)));
    // It takes some: the wait is over, and a new one starts from scratch.
    std::thread::sleep(STEP);
    let mut got = [0u8; 512];
    theirs.read_exact(&mut got).await.expect("read");
    io.write_all(&[b'z'; 512]).await.expect("room again");
    let more = tokio::time::timeout(Duration::from_millis(20), io.write_all(b"y")).await;
    assert!(more.is_err());
    std::thread::sleep(STEP);
    assert!(matches!(a.verdict(H, IDLE, WL), Verdict::Wait(_)));
    // An answer ending meanwhile writes nothing: the wait goes on.
    drop(a.request());
    std::thread::sleep(STEP + Duration::from_millis(100));
    assert_eq!(a.verdict(H, IDLE, WL), Verdict::WriteTimeout);
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
