// A Node.js TCP server that ends each connection with destroy() once its write is done: libuv
// closes the fd with syscall(SYS_close), not libc's close. Serves FILE on ADDR:PORT; after
// each connection it reads FILE again (fs, which gets the lowest free fd: the one just
// closed) and logs "served n=N reread_sha=HEX". Writes PIDFILE once it listens.
const net = require('node:net');
const fs = require('node:fs');
const crypto = require('node:crypto');
const [addr, port, file, pidfile, logfile] = process.argv.slice(2);
const body = fs.readFileSync(file);
let n = 0;
net.createServer((sock) => {
  sock.on('error', (e) => fs.appendFileSync(logfile, `error ${e.message}\n`));
  sock.write(body, () => {
    sock.destroy();
    const again = crypto.createHash('sha256').update(fs.readFileSync(file)).digest('hex');
    fs.appendFileSync(logfile, `served n=${++n} reread_sha=${again}\n`);
  });
}).listen(Number(port), addr, () => fs.writeFileSync(pidfile, `${process.pid}\n`));
process.on('SIGTERM', () => process.exit(0));
