// Package kerneltest holds the tests that prove the datapath on a kernel
// with the test binary alone (no ip, nft or ss): what the kernel must
// offer (a kernel that lacks it is refused by name, by the library and by
// the socklane command), loading, bypass integrity, verdict windows and
// the byte counts under them, the blocking fallback and service load
// balancing. They run on the host in the suite, and inside each kernel of
// the matrix (scripts/kernel-matrix.sh boots Debian's kernels in qemu with
// the static test binaries in the initramfs).
package kerneltest
