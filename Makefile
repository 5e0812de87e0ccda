# Build and install rsock: the CLI, the shim, the man pages, shell completions (bash, zsh,
# fish) and an example rules file. The man pages and completions are not in the tree: the
# rsock just built writes them from its own command-line definitions (cli/src/args.rs).
#
#   make                          cargo build --release of the shim and the CLI
#   make install                  into $(DESTDIR)$(PREFIX); PREFIX defaults to /usr/local
#   make install PREFIX=/usr DESTDIR=/tmp/stage
#   make uninstall                (same PREFIX and DESTDIR)
#
# The CLI is built knowing $(LIBDIR) (RSOCK_LIBDIR at build time) as one of the places of
# the shim, so `make install` rebuilds it (with cargo, if it is on PATH) when PREFIX differs
# from the last build's. The
# rules file goes to $(DESTDIR)/etc/rsock.conf — the path the shim reads, whatever the
# PREFIX — and only if there is none there yet.

PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib/rsock
MANDIR ?= $(PREFIX)/share/man
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions
ZSHCOMPDIR ?= $(PREFIX)/share/zsh/vendor-completions
FISHCOMPDIR ?= $(PREFIX)/share/fish/vendor_completions.d
CARGO ?= cargo
INSTALL ?= install

RELEASE := target/release

.PHONY: all build install uninstall

all: build

build:
	RSOCK_LIBDIR=$(LIBDIR) $(CARGO) build --release --workspace --lib --bins

# `sudo make install` after `make` works where root has no cargo: what was built is installed.
install:
	@if command -v $(CARGO) >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory build; \
	elif [ -f $(RELEASE)/rsock ] && [ -f $(RELEASE)/librsock.so ]; then \
		echo "$(CARGO) not found: installing what was built before"; \
	else \
		echo "$(CARGO) not found and nothing built: run make first" >&2; exit 1; \
	fi
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(MANDIR)/man1 \
		$(DESTDIR)$(BASHCOMPDIR) $(DESTDIR)$(ZSHCOMPDIR) $(DESTDIR)$(FISHCOMPDIR) $(DESTDIR)/etc
	$(INSTALL) -m 755 $(RELEASE)/rsock $(DESTDIR)$(BINDIR)/rsock
	$(INSTALL) -m 644 $(RELEASE)/librsock.so $(DESTDIR)$(LIBDIR)/librsock.so
	$(RELEASE)/rsock __man $(DESTDIR)$(MANDIR)/man1
	$(RELEASE)/rsock completions bash > $(DESTDIR)$(BASHCOMPDIR)/rsock
	$(RELEASE)/rsock completions zsh > $(DESTDIR)$(ZSHCOMPDIR)/_rsock
	$(RELEASE)/rsock completions fish > $(DESTDIR)$(FISHCOMPDIR)/rsock.fish
	chmod 644 $(DESTDIR)$(BASHCOMPDIR)/rsock $(DESTDIR)$(ZSHCOMPDIR)/_rsock \
		$(DESTDIR)$(FISHCOMPDIR)/rsock.fish
	@if [ -e $(DESTDIR)/etc/rsock.conf ]; then \
		echo "keeping $(DESTDIR)/etc/rsock.conf (the example is etc/rsock.conf)"; \
	else \
		echo "$(INSTALL) -m 644 etc/rsock.conf $(DESTDIR)/etc/rsock.conf"; \
		$(INSTALL) -m 644 etc/rsock.conf $(DESTDIR)/etc/rsock.conf; \
	fi

# /etc/rsock.conf goes only if it is still the example as installed. The man pages are
# rsock.1 and one rsock-COMMAND.1 per command.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/rsock $(DESTDIR)$(LIBDIR)/librsock.so \
		$(DESTDIR)$(MANDIR)/man1/rsock.1 $(DESTDIR)$(MANDIR)/man1/rsock-*.1 \
		$(DESTDIR)$(BASHCOMPDIR)/rsock $(DESTDIR)$(ZSHCOMPDIR)/_rsock \
		$(DESTDIR)$(FISHCOMPDIR)/rsock.fish
	-rmdir $(DESTDIR)$(LIBDIR) 2>/dev/null
	@if cmp -s etc/rsock.conf $(DESTDIR)/etc/rsock.conf; then \
		echo "rm -f $(DESTDIR)/etc/rsock.conf"; rm -f $(DESTDIR)/etc/rsock.conf; \
	elif [ -e $(DESTDIR)/etc/rsock.conf ]; then \
		echo "keeping $(DESTDIR)/etc/rsock.conf (changed since it was installed)"; \
	fi
