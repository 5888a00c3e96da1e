//! One job runner for independent simulations (policies, sweep points, decode modes) of both
//! systems.

/// `f` of every job, computed on up to `threads` scoped threads that take jobs in order;
/// the results come back in job order, so they do not depend on the thread count.
pub fn parallel_map<J: Sync, R: Send>(
    jobs: &[J],
    threads: usize,
    f: impl Fn(&J) -> R + Sync,
) -> Vec<R> {
    let order: Vec<usize> = (0..jobs.len()).collect();
    parallel_map_in(jobs, &order, threads, f)
}

/// Like [`parallel_map`], with the jobs started in `order` (a permutation of the job indices),
/// for example the longest first, so that no thread is left with a long job at the end while
/// the others are idle. Results still come back in job order.
pub fn parallel_map_in<J: Sync, R: Send>(
    jobs: &[J],
    order: &[usize],
    threads: usize,
    f: impl Fn(&J) -> R + Sync,
) -> Vec<R> {
    assert_eq!(order.len(), jobs.len(), "the order names every job once");
    let mut named = vec![false; jobs.len()];
    for &i in order {
        assert!(
            !std::mem::replace(&mut named[i], true),
            "job {i} named twice"
        );
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        jobs.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| {
                // Bounded: each round takes a place in the order; places past the end stop
                // the loop.
                loop {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(&i) = order.get(k) else {
                        break;
                    };
                    let r = f(&jobs[i]);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_start_in_the_order_given_and_results_come_back_in_job_order() {
        let started = std::sync::Mutex::new(Vec::new());
        let out = parallel_map_in(&[10, 20, 30, 40], &[2, 0, 3, 1], 1, |&j| {
            started.lock().unwrap().push(j);
            j + 1
        });
        assert_eq!(out, [11, 21, 31, 41]);
        assert_eq!(started.into_inner().unwrap(), [30, 10, 40, 20]);
        let out = parallel_map_in(&[1, 2, 3], &[1, 2, 0], 2, |&j| j * 2);
        assert_eq!(out, [2, 4, 6]);
    }

    #[test]
    #[should_panic(expected = "named twice")]
    fn an_order_that_repeats_a_job_is_refused() {
        parallel_map_in(&[1, 2], &[1, 1], 1, |&j| j);
    }
}
