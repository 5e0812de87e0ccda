# Latency vs message size for bench/rdma (gnuplot -e "datafile='...'; outfile='...'" latency.gp).
# Columns of datafile: size verbs rstream_mean rspreload tcp rsock (median RTT, µs; NaN = none).
set terminal pngcairo size 900,640 font "sans,11"
set output outfile
set title "Ping-pong round trip vs message size (Soft-RoCE in a TCG guest; medians)"
set xlabel "message size (bytes)"
set ylabel "round-trip time (µs, log scale)"
set logscale xy
set xtics ("64" 64, "1K" 1024, "4K" 4096, "16K" 16384, "64K" 65536)
set xrange [48:90000]
set grid xtics ytics mytics
set key outside below center vertical maxrows 3 box
set bmargin 9
set datafile missing "NaN"
plot datafile using 1:2 with linespoints lw 2 pt 7 lc rgb "#6a3d9a" title "raw verbs (ib\\_write\\_lat, 2x one-way)", \
     datafile using 1:3 with linespoints lw 2 pt 5 lc rgb "#33a02c" title "rsocket (rstream, mean)", \
     datafile using 1:4 with linespoints lw 2 pt 4 dt 2 lc rgb "#33a02c" title "rsocket (pingpong + librspreload)", \
     datafile using 1:5 with linespoints lw 2 pt 9 lc rgb "#1f78b4" title "kernel TCP (pingpong, over veth)", \
     datafile using 1:6 with linespoints lw 3 pt 11 lc rgb "#e31a1c" title "rsock (pingpong + librsock.so)"
