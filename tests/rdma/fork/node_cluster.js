// Node.js cluster in its default (round-robin) mode: the primary accepts every connection
// and sends its handle to a worker over the IPC channel (SCM_RIGHTS). Serves the file
// argv[4] at /data.bin on ADDR:PORT with 2 workers; `Connection: close` on every response.
// Writes PIDFILE (the primary's pid) once both workers listen; logs "served pid=W" lines.
const cluster = require('node:cluster');
const http = require('node:http');
const fs = require('node:fs');
const [addr, port, file, pidfile, logfile] = process.argv.slice(2);
if (cluster.isPrimary) {
  let up = 0;
  for (let i = 0; i < 2; i++) {
    cluster.fork().on('listening', () => { if (++up === 2) fs.writeFileSync(pidfile, `${process.pid}\n`); });
  }
  process.on('SIGTERM', () => { for (const id in cluster.workers) cluster.workers[id].kill(); process.exit(0); });
} else {
  const body = fs.readFileSync(file);
  http.createServer((req, res) => {
    res.writeHead(200, { 'Content-Length': body.length, 'Connection': 'close' });
    res.end(body);
    fs.appendFileSync(logfile, `served pid=${process.pid}\n`);
  }).listen(Number(port), addr);
}
