package sockbugs

//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -nostdinc -I../datapath/include" -type lv_timer -type lv_const -type lv_mode lateverdict lateverdict.c
