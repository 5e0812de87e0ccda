# shellcheck shell=bash
# nginx and PostgreSQL set-up shared by tests/rdma/fork_matrix.sh and bench/rdma/fork.sh
# (sourced; runs in the test-bed guest, as root).
#
#   nginx_conf DIR ADDR PORT ACCEPT_MUTEX(on|off) [LISTEN_OPTS]
#       writes DIR/nginx.conf: master + 2 workers in the foreground (daemon off), with no
#       `user` line (nginx's own default: the master runs as root, the workers as nobody),
#       or `user $NGINX_USER;` when NGINX_USER is set (Debian's packaged config: www-data),
#       pid DIR/nginx.pid, logs DIR/nginx-error.log and DIR/access.log ("$pid $connection
#       $status $body_bytes_sent $request"), temp dirs under DIR, files served from DIR/www.
#       Run: nginx -p DIR -c DIR/nginx.conf -e DIR/nginx-error.log
#   pg_bin                   prints the newest /usr/lib/postgresql/*/bin
#   as_pg CMD...             CMD as user postgres (setpriv: no PAM, limits kept)
#   pg_init DIR              a fresh cluster in DIR/data (trust auth, also from 10.77.0.0/24;
#                            user postgres), owned by postgres; DIR is created and chowned too
#                            (its socket directory)
#   pg_server_args DIR ADDR PORT   postgres's arguments: listen on ADDR:PORT only, socket in
#                            DIR, fsync off, 20 connections

nginx_conf() {
    local d=$1 addr=$2 port=$3 mutex=$4 lopts=${5:-}
    mkdir -p "$d/www" "$d/nginx-tmp"
    cat > "$d/nginx.conf" <<CONF
daemon off;
master_process on;
worker_processes 2;
${NGINX_USER:+user $NGINX_USER;}
pid $d/nginx.pid;
error_log $d/nginx-error.log info;
events { worker_connections 256; accept_mutex $mutex; }
http {
    log_format fork '\$pid \$connection \$status \$body_bytes_sent \$request';
    access_log $d/access.log fork;
    client_body_temp_path $d/nginx-tmp/body;
    proxy_temp_path $d/nginx-tmp/proxy;
    fastcgi_temp_path $d/nginx-tmp/fastcgi;
    uwsgi_temp_path $d/nginx-tmp/uwsgi;
    scgi_temp_path $d/nginx-tmp/scgi;
    sendfile on;
    keepalive_timeout 5;
    default_type application/octet-stream;
    server {
        listen $addr:$port $lopts;
        root $d/www;
    }
}
CONF
}

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1; }

as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }

pg_init() {
    local d=$1
    mkdir -p "$d" && chown postgres: "$d" || return 1
    as_pg "$(pg_bin)/initdb" -D "$d/data" -A trust -U postgres --no-sync > "$d/initdb.out" 2>&1 || return 1
    # initdb trusts only loopback: the test bed's clients come from 10.77.0.1 and 10.77.0.2.
    echo "host all all 10.77.0.0/24 trust" >> "$d/data/pg_hba.conf"
}

pg_server_args() {
    echo -D "$1/data" -p "$3" -k "$1" -c listen_addresses="$2" -c fsync=off -c synchronous_commit=off \
        -c max_connections=20 -c shared_buffers=16MB -c logging_collector=off
}
