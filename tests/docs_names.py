#!/usr/bin/env python3
"""Every path and symbol a doc names in backticks exists (TAP, one line a doc).

    docs_names.py ROOT [DOC.md...]     (default: ROOT/README.md, ROOT/docs/*.md)

Inside inline backticks (fenced blocks are examples, not claims), outside
fenced code blocks:

- a path: a token made of path characters whose first part is an entry
  of the tree's top folder (`core/`, `docs/design.md`), `refit/` (an
  installed header, include/refit/, or the Python package,
  bindings/python/refit/), `.` or `..` (from the doc's folder); or a bare
  file name with a source extension (.c .h .cu .cc .py .sh .md .yaml
  .build), which must be some file's name in the tree. `<name>` and `*`
  parts are globs that must match something. Not checked: other projects'
  paths, install and machine paths (`DATADIR/...`, `/usr/...`), and
  placeholders (a part in capitals: `OUT.json`, `snapshots/REV/...`).
- a symbol: every refit_/REFIT_ identifier, and every identifier called
  with parentheses (`name()`, `obj.name(x)`), must occur as a word in the
  sources (the tree's code, build and script files, not its docs); one
  ending in `_` (`REFIT_GPU_*`) names a family: some word must start so;
  a metric's NAME_bucket, NAME_sum or NAME_count needs NAME.

A doc may exempt what it names on purpose though it is not in the tree (a
proposal, another project's function) with an HTML comment on any line:
<!-- names: st_writer_put REFIT_1 -->, each word a path or symbol.
"""
import fnmatch
import os
import re
import subprocess
import sys

BARE_EXT = ('.c', '.h', '.cu', '.cc', '.py', '.sh', '.md', '.yaml', '.build')
CODE_EXT = ('.c', '.h', '.cu', '.cc', '.py', '.sh', '.build', '.map', '.in', '.yaml', '.toml',
            '.txt', '.dict')
PATH_TOKEN = re.compile(r'^[A-Za-z0-9_.*<>+-]+(/[A-Za-z0-9_.*<>+-]*)*$')
IDENT = re.compile(r'\b((?:refit|REFIT)_[A-Za-z0-9_]+)')
CALL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*\(')
FENCE = re.compile(r'^\s*(```|~~~)')
SPAN = re.compile(r'(`+)([^`]+?)\1', re.S)
EXEMPT = re.compile(r'<!--\s*names:(.*?)-->')
# words of C and of the docs' pseudo-code that a call form may use
NOT_SYMBOLS = {'if', 'for', 'while', 'return', 'sizeof', 'switch', 'defined', 'offsetof',
               'assert', 'main', 'fma', 'fmaf', 'fminf', 'fmaxf', 'fabsf', 'rintf', 'ldexpf',
               'frexpf', 'isfinite', 'isnan', 'memcpy', 'memset', 'malloc', 'free', 'printf',
               'dlopen', 'dlsym', 'dlclose', 'fstat', 'stat', 'open', 'mmap', 'fork', 'exit'}


def tree_files(root):
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-co', '--exclude-standard'],
                             check=True, capture_output=True, text=True).stdout.split('\n')
        return [f for f in out if f and os.path.exists(os.path.join(root, f))]
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if not x.startswith(('.', 'build'))]
            files += [os.path.relpath(os.path.join(d, n), root) for n in names]
        return files


def source_words(root, files):
    words = set()
    word = re.compile(r'[A-Za-z_][A-Za-z0-9_]*')
    for f in files:
        if not f.endswith(CODE_EXT) and os.path.basename(f) != 'meson.build':
            continue
        try:
            with open(os.path.join(root, f), encoding='utf-8', errors='replace') as fh:
                words.update(word.findall(fh.read()))
        except OSError:
            pass
    return words


def spans(text):
    """(line number, span) of every inline code span outside fenced blocks;
    a span may go on over a line break, not over a blank line."""
    lines, fenced = [], False
    for line in text.split('\n'):
        fence = FENCE.match(line)
        lines.append('' if fenced or fence else line)
        if fence:
            fenced = not fenced
    prose = '\n'.join(lines)
    for m in SPAN.finditer(prose):
        if '\n\n' not in m.group(2):
            yield prose.count('\n', 0, m.start()) + 1, ' '.join(m.group(2).split())


def placeholder(part):
    stem = part.split('.')[0]
    return bool(re.search('[A-Z]', stem)) and stem.upper() == stem


def is_path(tok, tops):
    if not PATH_TOKEN.match(tok) or any(placeholder(p) for p in tok.split('/')):
        return False
    if '/' in tok:
        return tok.split('/')[0] in tops or tok.split('/')[0] in ('refit', '.', '..')
    return tok.endswith(BARE_EXT) and len(tok) > 4


def path_exists(root, docdir, tok, files, names):
    pat = re.sub(r'<[^>]*>', '*', tok)
    if '/' not in pat:
        return any(fnmatch.fnmatchcase(n, pat) for n in names)
    pat = pat.rstrip('/')
    for base in ('', os.path.relpath(docdir, root), 'include', 'bindings/python'):
        full = os.path.normpath(os.path.join(base, pat))
        if '*' not in full:
            if os.path.exists(os.path.join(root, full)):
                return True
        elif any(fnmatch.fnmatchcase(f, full) or fnmatch.fnmatchcase(f, full + '/*')
                 for f in files):
            return True
    return False


def symbol_exists(sym, words):
    if sym.endswith('_'):
        return any(w.startswith(sym) for w in words)
    # a histogram's series (Prometheus): NAME_bucket, _sum, _count of NAME
    base = re.sub(r'_(bucket|sum|count)$', '', sym)
    return sym in words or base in words


def check_doc(root, path, files, names, words, tops):
    with open(path, encoding='utf-8') as fh:
        text = fh.read()
    exempt = set()
    for m in EXEMPT.finditer(text):
        exempt.update(m.group(1).split())
    docdir = os.path.dirname(os.path.abspath(path))
    bad = []
    for n, span in spans(text):
        for tok in span.split():
            tok = tok.strip(',;:')
            tok = re.sub(r':[0-9]+$', '', tok)  # file.c:123
            if tok not in exempt and is_path(tok, tops) and not path_exists(root, docdir, tok, files, names):
                bad.append('%d: `%s`: no such path in the tree' % (n, tok))
        syms = set(IDENT.findall(span))
        syms.update(c for c in CALL.findall(span) if c not in NOT_SYMBOLS)
        for s in sorted(syms):
            if s not in exempt and not symbol_exists(s, words):
                bad.append('%d: `%s`: no such symbol in the sources' % (n, s))
    return bad


def main(argv):
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = os.path.abspath(argv[1])
    docs = argv[2:] or [os.path.join(root, 'README.md')] + sorted(
        os.path.join(root, 'docs', f) for f in os.listdir(os.path.join(root, 'docs'))
        if f.endswith('.md'))
    files = tree_files(root)
    names = {os.path.basename(f) for f in files}
    words = source_words(root, [f for f in files if not f.endswith('.md')])
    tops = {f.split('/')[0] for f in files}
    print('1..%d' % len(docs))
    failed = 0
    for i, doc in enumerate(docs, 1):
        rel = os.path.relpath(doc, root)
        bad = check_doc(root, doc, files, names, words, tops)
        if bad:
            failed += 1
            print('not ok %d - %s names %d missing paths or symbols' % (i, rel, len(bad)))
            for b in bad:
                print('# %s:%s' % (rel, b))
        else:
            print('ok %d - %s' % (i, rel))
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv))
