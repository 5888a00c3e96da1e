use super::*;

fn pts(v: &[(u32, u64)]) -> Vec<(u32, Nanos)> {
    v.iter().map(|&(x, y)| (x, Nanos(y))).collect()
}

#[test]
fn interpolation_is_linear_between_points_and_flat_below_the_first() {
    let p = pts(&[(4, 100), (8, 200), (16, 240)]);
    assert_eq!(interpolate(&p, 0), Nanos(100));
    assert_eq!(interpolate(&p, 1), Nanos(100));
    assert_eq!(interpolate(&p, 4), Nanos(100));
    assert_eq!(interpolate(&p, 6), Nanos(150));
    assert_eq!(interpolate(&p, 8), Nanos(200));
    assert_eq!(interpolate(&p, 12), Nanos(220));
    assert_eq!(interpolate(&p, 16), Nanos(240));
    // Rounds to the nearest nanosecond: 200 + 40 * 1/8 = 205.
    assert_eq!(interpolate(&p, 9), Nanos(205));
}

#[test]
fn interpolation_extrapolates_the_last_segment_but_never_below_the_last_value() {
    let up = pts(&[(4, 100), (8, 200)]);
    assert_eq!(interpolate(&up, 12), Nanos(300));
    assert_eq!(interpolate(&up, 1000), Nanos(100 + 25 * 996));
    let down = pts(&[(4, 300), (8, 200)]);
    assert_eq!(interpolate(&down, 6), Nanos(250));
    assert_eq!(interpolate(&down, 100), Nanos(200));
    let one = pts(&[(16, 70)]);
    assert_eq!(interpolate(&one, 1), Nanos(70));
    assert_eq!(interpolate(&one, 1 << 20), Nanos(70));
    assert_eq!(interpolate(&[], 5), Nanos::ZERO);
}

#[test]
fn shard_profiles_read_their_own_grids() {
    let s = ShardProfile {
        layers: 0..2,
        prefill: pts(&[(1, 10), (8, 80)]),
        decode: pts(&[(1, 5), (16, 20)]),
    };
    assert_eq!(s.prefill(4), Nanos(40));
    assert_eq!(s.decode(6), Nanos(10));
    assert_eq!(s.decode(31), Nanos(35));
}
