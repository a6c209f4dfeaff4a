from keg.cli import app

app(prog_name="keg")
