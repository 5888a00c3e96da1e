use super::*;

#[test]
fn cdf_points_keep_the_extremes_and_end_at_one() {
    let v: Vec<f64> = (1..=5000).map(f64::from).collect();
    let p = cdf_points(&v);
    assert_eq!(p.len(), CDF_POINTS);
    assert_eq!(p[0], (1.0, 1.0 / 5000.0));
    assert_eq!(*p.last().unwrap(), (5000.0, 1.0));
    assert!(p.windows(2).all(|w| w[0].0 <= w[1].0 && w[0].1 < w[1].1));
    assert_eq!(cdf_points(&[3.0]), vec![(3.0, 1.0)]);
    assert!(cdf_points(&[]).is_empty());
}

#[test]
fn ticks_drop_decimals_as_the_axis_grows() {
    assert_eq!(tick(1234.5, 2000.0), "1234");
    assert_eq!(tick(0.0, 2000.0), "0");
    assert_eq!(tick(12.34, 15.0), "12.3");
    assert_eq!(tick(0.126, 1.0), "0.13");
    assert_eq!(log_tick(0.5), "0.5");
    assert_eq!(log_tick(200.0), "200");
}

#[test]
fn log_axis_ticks_are_one_two_five_per_decade() {
    let a = LogAxis {
        lo: 13.0,
        hi: 600.0,
    };
    assert_eq!(a.key_points(30), vec![20.0, 50.0, 100.0, 200.0, 500.0]);
    let wide = LogAxis { lo: 0.5, hi: 2e6 };
    assert_eq!(
        wide.key_points(12),
        vec![1.0, 10.0, 100.0, 1e3, 1e4, 1e5, 1e6]
    );
}

#[test]
fn axis_ranges_are_finite_and_non_empty_whatever_the_values() {
    assert_eq!(log_range([10.0, 100.0].into_iter()), (8.0, 125.0));
    for bad in [f64::INFINITY, f64::NAN, -1.0, 0.0] {
        assert_eq!(log_range([bad].into_iter()), (1.0, 10.0), "{bad}");
        assert_eq!(finite_top(bad), 1.0, "{bad}");
    }
    assert_eq!(log_range([f64::INFINITY, 10.0].into_iter()), (8.0, 20.0));
    assert_eq!(log_range([f64::MAX].into_iter()), (1.0, 10.0));
    assert_eq!(finite_top(2.5), 2.5);
}

#[test]
fn ticked_log_axis_keeps_its_ticks_and_thins_them() {
    let a = TickedLogAxis {
        lo: 40.0,
        hi: 800.0,
        ticks: vec![64.0, 128.0, 512.0],
    };
    assert_eq!(a.key_points(10), vec![64.0, 128.0, 512.0]);
    assert_eq!(a.key_points(2), vec![64.0, 512.0]);
    assert!(a.map(&64.0, (0, 100)) < a.map(&128.0, (0, 100)));
}
