// Package kerneltest holds the tests that prove the datapath on a kernel
// with nothing but the test binary: no socklane binary, no ip, nft or ss.
// They run on the host in the suite, and inside each kernel of the matrix
// (scripts/kernel-matrix.sh boots Debian's kernels in qemu with the static
// test binary in the initramfs).
package kerneltest
