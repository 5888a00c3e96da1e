use super::*;

/// The messages of the test actors.
#[derive(Debug)]
enum T {
    Ping,
    Done,
}

/// Records whether `T::Done` ever reached it.
struct Sink {
    got: bool,
}

impl Actor<T> for Sink {
    fn handle(&mut self, msg: T, _ctx: &mut dyn Context<T>) {
        if matches!(msg, T::Done) {
            self.got = true;
        }
    }
    fn report(&mut self, report: &mut Report) {
        if !self.got {
            report.violations.push("the sink got nothing".into());
        }
    }
}

/// On `Ping`, works for a while, then sends `Done` to actor 0.
struct Relay;

impl Actor<T> for Relay {
    fn handle(&mut self, msg: T, ctx: &mut dyn Context<T>) {
        if matches!(msg, T::Ping) {
            std::thread::sleep(Duration::from_millis(50));
            ctx.send(ActorId(0), T::Done, 0);
        }
    }
    fn report(&mut self, _report: &mut Report) {}
}

/// At the start, sets a timer; then sends `Ping` to actor 1.
struct Source;

impl Actor<T> for Source {
    fn start(&mut self, ctx: &mut dyn Context<T>) {
        ctx.timer(Nanos::from_ms(5), T::Done);
    }
    fn handle(&mut self, msg: T, ctx: &mut dyn Context<T>) {
        if matches!(msg, T::Done) {
            ctx.send(ActorId(1), T::Ping, 0);
        }
    }
    fn report(&mut self, _report: &mut Report) {}
}

/// Panics at the start.
struct Faulty;

impl Actor<T> for Faulty {
    fn start(&mut self, _ctx: &mut dyn Context<T>) {
        panic!("boom");
    }
    fn handle(&mut self, _msg: T, _ctx: &mut dyn Context<T>) {}
    fn report(&mut self, _report: &mut Report) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_ends_only_when_no_message_is_in_flight() {
    for _ in 0..5 {
        let actors: Vec<Box<dyn Actor<T>>> = vec![
            Box::new(Sink { got: false }),
            Box::new(Relay),
            Box::new(Source),
        ];
        let out = run(actors, 1, Duration::from_secs(30)).await.unwrap();
        // Start x3, the timer, Ping, Done.
        assert_eq!(out.messages, 6);
        assert!(out.wall >= Duration::from_millis(50));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_actor_ends_the_run_at_once_with_its_message() {
    // Actor 0 keeps a long timer in flight; the panic must not wait for it.
    struct Waiter;
    impl Actor<T> for Waiter {
        fn start(&mut self, ctx: &mut dyn Context<T>) {
            ctx.timer(Nanos::from_secs(20), T::Done);
        }
        fn handle(&mut self, _msg: T, _ctx: &mut dyn Context<T>) {}
        fn report(&mut self, _report: &mut Report) {}
    }
    let started = Instant::now();
    let actors: Vec<Box<dyn Actor<T>>> = vec![Box::new(Waiter), Box::new(Faulty)];
    let err = run(actors, 1, Duration::from_secs(60)).await.unwrap_err();
    assert!(err.to_string().contains("actor 1 panicked: boom"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}
