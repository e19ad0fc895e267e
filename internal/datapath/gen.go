package datapath

//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -type sl_tuple -type sl_dest -type sl_dest_stat -type sl_listener -type sl_conn -type sl_conn_ref -type sl_reclaim_args -type sl_sock -type sl_counters -type sl_counter -type sl_conn_state -type sl_layout_version -type sl_path -type sl_role -type sl_event -type sl_event_type -type sl_events_cfg -type sl_capture_cfg -type sl_cap_hdr bypass bypass.c

//go:generate go tool bpf2go -tags linux -target bpfel -no-global-types -cc clang-19 -strip llvm-strip-19 -cflags "-O2 -g -Wall -Werror -mcpu=v3 -I/usr/include/x86_64-linux-gnu" -type sl_svc_key -type sl_svc_val -type sl_backend_key -type sl_backend -type sl_member_key -type sl_member -type sl_member_state -type sl_affinity_key -type sl_lb_conn -type sl_lb_counters -type sl_lb_counter servicelb servicelb.c
