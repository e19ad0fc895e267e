package statesync

//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -nostdinc -I../datapath/include" -type sl_sync_limits -type sl_sync_record -type sl_sync_stage -type sl_churn_op -type sl_churn_val -type sl_churn_args churn churn.c
//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -nostdinc -I../datapath/include" -type sl_sync_lookup_cfg -type sl_sync_lookup_args lookup lookup.c
//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -nostdinc -I../datapath/include" -type sl_trace_cfg trace trace.c
