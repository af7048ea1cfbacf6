"""inferledger.engine"""
