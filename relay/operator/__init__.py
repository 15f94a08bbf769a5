"""What operators use: recorded commands (commands.py), doctor's checks (doctor.py), the roster of
agents and their pings (roster.py), queues (queues.py), the HTML report (report.py), the text
views of every verb (views.py), the service units (units.py) and keeping the state directory
out of git (gitignore.py)."""
