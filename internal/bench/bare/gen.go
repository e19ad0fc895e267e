package bare

//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -nostdinc -I../../datapath/include" -type sl_bare_key -type sl_bare_counter bare bare.c
