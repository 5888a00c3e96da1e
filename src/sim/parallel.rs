//! One job runner for independent simulations (policies, sweep points, decode modes) of both
//! systems.

/// `f` of every job, computed on up to `threads` scoped threads that take jobs in order;
/// the results come back in job order, so they do not depend on the thread count.
pub fn parallel_map<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    f: impl Fn(&J) -> R + Sync,
) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| {
                // Bounded: each round takes a job index; indices past the end stop the loop.
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else {
                        break;
                    };
                    let r = f(job);
                    *slots[i].lock().expect("no panics while holding the lock") = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .expect("no panics while holding the lock")
                .expect("every job ran")
        })
        .collect()
}
