"""inferledger.cli"""
