"""The incident report: which alert records it can draw, each alert's timeline
(from a detector's view or from the alert's evidence), and the self-contained HTML
page with its charts, written whole. Imports ``detectors`` only."""
