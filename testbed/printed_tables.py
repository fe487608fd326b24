"""The markdown tables a bench prints among its other output (the criterion benches of
shared-core/benches), for a bench's wrapper to keep in its result file."""


def printed_tables(output, starts):
    """`output`'s tables by name (`starts`: name: how its header line begins), each a list of its
    lines, header first. A table printed again (one run per part) adds its rows under the first
    one's header; a table of no known start is left out."""
    found, current, header = {}, None, 0
    for text in output.splitlines():
        if not text.startswith("|"):
            current = None
            continue
        if current is None:
            current = next((name for name, start in starts.items() if text.startswith(start)), None)
            if current is None:
                continue
            header = 2 if current in found else 0  # its header and rule, already kept
        if header:
            header -= 1
            continue
        found.setdefault(current, []).append(text)
    return found
