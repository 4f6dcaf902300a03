//! Helpers shared by the kernel tests.

/// A uniform value in [−1, 1) from a hash of (k, salt) (splitmix64): matrices of these are well
/// conditioned as random matrices are, and every bit of an integer drawn from one varies.
pub fn val(k: usize, salt: usize) -> f64 {
    let mut z = (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (salt as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}
