"""What the user sees: the one output sink (rich tables for people, one JSON object for `--json`), the one
sanitiser for every string a host, the API or a user supplied, the phase log and the live view, a progress bar's
latest drawing, and dollars in a sentence.

Kept together so that whatever a command shows goes through one sink and one sanitiser.
"""
