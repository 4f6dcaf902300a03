//! Conversions to and from `ndarray::ArrayD` (feature `ndarray`).
#![cfg(feature = "ndarray")]

use nx_kernels::{Array, Move};
use nx_mesh::Device;

#[test]
fn round_trips_through_ndarray() {
    let a = Array::<i16>::from_fn(Device::sim(0), &[2, 3], |i| (i[0] * 3 + i[1]) as i16).unwrap();
    let t = a.apply(&Move::Permute(vec![1, 0])).unwrap().unwrap();
    let nd = t.to_ndarray().unwrap();
    assert_eq!(nd.shape(), &[3, 2]);
    assert_eq!(nd[[2, 1]], 5);
    let back = Array::from_ndarray(Device::sim(1), &nd).unwrap();
    assert_eq!(back.to_vec().unwrap(), t.to_vec().unwrap());
}
